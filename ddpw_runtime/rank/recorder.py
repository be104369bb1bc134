"""A rank's flight recorder (torch's record of its collectives), dumped into its `fr_rank_<k>` next to its log when the
supervisor takes its stacks (`DUMP_SIGNAL`: after faulthandler, `on_request`) and when its task failed. Best effort:
a rank stuck in C code (the handler runs between Python lines) only leaves its stacks."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ddpw_runtime import _compat
from ddpw_runtime.launch.payload import write_atomically
from ddpw_runtime.launch.plan import DUMP_SIGNAL
from ddpw_runtime.launch.records import RankResult

_dump_to: Path | None = None  # this rank's dump, once `arm` was called
_armed_in: int | None = None  # the process that armed it: the rank's, not a process it forked (a DataLoader worker)
_register_stacks: Callable[[], None] | None = None  # how this process has faulthandler write its stacks (`keep_stacks`)


def keep_stacks(register: Callable[[], None]) -> None:
    """Call `register` now, the rank's process module's registration of faulthandler's stack dump on `DUMP_SIGNAL`
    (every thread's stack, even while the task is in C code, as in a collective), and again at `restore_stacks`."""
    global _register_stacks
    _register_stacks = register
    register()


def restore_stacks() -> None:
    """Register the stack dump again (`keep_stacks`). A library that sets every signal's handler back to what
    `signal.getsignal` gave (Lightning's Trainer, as its fit, validate, test or predict ends) installs the one that
    Python knows, which lies under faulthandler's: the rank's stacks would no longer be written, so a request for them
    would find the rank as if it had ended."""
    if _register_stacks is not None:
        faulthandler.unregister(DUMP_SIGNAL)  # (else faulthandler, which counts itself registered, would not)
        _register_stacks()


def no_stacks() -> None:
    """Write no stacks on `DUMP_SIGNAL` from now on: the signal gets the handler that Python has for it."""
    global _register_stacks
    _register_stacks = None
    faulthandler.unregister(DUMP_SIGNAL)


def arm(path: Path | None, asked: bool = True) -> None:
    """Dump into `path` from now on (None: no longer) after a failed task and, if `asked`, when the supervisor takes
    the stacks (`on_request`, installed before faulthandler's `chain=True` one, so it runs after it); an empty file
    there then says this rank answers (dropping an earlier attempt's). A rank in the user's process is not `asked`."""
    global _dump_to, _armed_in
    _dump_to, _armed_in = path, os.getpid()
    if path is not None and asked:
        write_atomically(path, b"", 0o644)


def on_request(signum: int, frame: FrameType | None) -> None:
    """`DUMP_SIGNAL`: the supervisor takes this rank's stacks; the recorder goes with them."""
    dump()


def after(result: RankResult) -> None:
    """The task ended as `result`, its group still up: when it failed, dump which collective it was last in."""
    if not result.ok:
        dump()


def dump() -> None:
    """Write the flight recorder into this rank's dump (empty without a group); never raises, only logs a line. Not
    in a process the rank forked, which has its handler (a DataLoader worker asked for its stacks): its copy of the
    recorder is the rank's as it forked, and would take the place of the rank's own dump."""
    if _dump_to is None or os.getpid() != _armed_in:
        return
    try:
        write_atomically(_dump_to, _compat.flight_recorder_dump() or b"", 0o644)
    except Exception as error:  # the dump is an extra: never the task's failure
        sys.stderr.write(f"[ddpw] the flight recorder could not be dumped: {type(error).__name__}: {error}\n")
