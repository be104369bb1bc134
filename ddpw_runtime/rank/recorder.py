"""A rank's flight recorder (torch's record of the collectives it entered, with their sequence numbers), dumped
into its `fr_rank_<k>` next to its log: when the supervisor takes its stacks (`DUMP_SIGNAL`: faulthandler writes
them, then runs `on_request`) and when its task failed. Best effort: the hang report reads the dumps
that were written, and a rank stuck in C code (the handler runs between Python lines) only leaves its stacks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

from ddpw_runtime import _compat
from ddpw_runtime.launch.payload import write_atomically
from ddpw_runtime.launch.records import RankResult

_dump_to: Path | None = None
"""This rank's dump, once `arm` was called."""


def arm(path: Path | None, asked: bool = True) -> None:
    """Dump into `path` from now on (None: no longer) when the task's collective timed out (`after`) and, if
    `asked`, when the supervisor takes the rank's stacks (`on_request`, which a rank's process installs for
    `DUMP_SIGNAL` before faulthandler, registered with `chain=True`, so that it runs once faulthandler has written
    them); an empty file there then says that this rank answers (and drops an earlier attempt's dump). A rank in
    the user's process is not `asked`: its stacks handler is faulthandler's alone, for the whole run."""
    global _dump_to
    _dump_to = path
    if path is not None and asked:
        write_atomically(path, b"", 0o644)


def on_request(signum: int, frame: FrameType | None) -> None:
    """`DUMP_SIGNAL`: the supervisor takes this rank's stacks; the recorder goes with them."""
    dump()


def after(result: RankResult) -> None:
    """The task ended as `result`, its process group still up: when it failed (its collective timed out, or failed
    as a peer that timed out first went away), dump which collective it was last in, for the job's report."""
    if not result.ok:
        dump()


def dump() -> None:
    """Write what the flight recorder holds into this rank's dump (empty without a process group); never
    raises: what fails is a line in the rank's log."""
    if _dump_to is None:
        return
    try:
        write_atomically(_dump_to, _compat.flight_recorder_dump() or b"", 0o644)
    except Exception as error:  # the dump is an extra: never the task's failure
        sys.stderr.write(f"[ddpw] the flight recorder could not be dumped: {type(error).__name__}: {error}\n")
