"""How one rank of a job ended (`RankOutcome`), as plain data every supervising process and node hands on; the rule
that names a failed job's root cause among them is `outcome.py`'s."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ddpw_runtime.launch.records import COLLECTIVE_TIMEOUT_MARKERS, RaisedError, RankResult
from ddpw_runtime.launch.stacks import RankPlace, from_traceback

_LOG_TAIL_LINES = 20
_CRASH_REPORT = "Fatal Python error"
"""How faulthandler starts the report it writes into a rank's log when the rank crashes."""


@dataclass
class RankOutcome:
    """How one rank ended."""

    rank: int
    node: int
    result: RankResult | None
    """What the rank sent back; None when it sent nothing (killed, crashed, exited early)."""
    exit_code: int | None
    """Its exit code (negative: the signal that killed it); None for a rank that ran in the caller's
    own process, or whose end was never seen."""
    stopped: bool = False
    """The launcher stopped it: it was still running when the job was stopped or interrupted."""
    signals_sent: frozenset[int] = frozenset()
    """The signals the launcher sent to the job's ranks (they explain exits by those signals)."""
    ended_at: float = field(default_factory=time.time)
    log_file: str | None = None
    place: RankPlace | None = None
    """Where it was when the job was stopped, from its stack (None: it had ended)."""

    @property
    def error(self) -> RaisedError | None:
        """What it raised, as it sent it back."""
        return self.result.error if self.result is not None else None

    @property
    def failed(self) -> bool:
        """Whether the rank did not return a value and end cleanly."""
        return self.result is None or not self.result.ok or self.exit_code not in (0, None)

    @property
    def own_failure(self) -> bool:
        """Whether the rank failed by itself rather than being stopped by the launcher. A rank counted
        as stopped may have died on its own before its end was seen (a segfault or SIGKILL whose peer's
        "connection closed" came in first): with no result, an exit no signal the launcher sent explains
        is its own failure."""
        if self.result is not None and not self.result.ok:
            return True
        if self.result is None and self.exit_code is not None and -self.exit_code not in self.signals_sent:
            return True
        return not self.stopped

    @property
    def timed_out_in_collective(self) -> bool:
        """Whether it failed because a collective it waited in timed out (gloo's error, or NCCL's watchdog in its
        log)."""
        if self.error is not None:
            return self.error.is_collective_timeout
        return self.result is None and any(marker in log_tail(self.log_file) for marker in COLLECTIVE_TIMEOUT_MARKERS)

    def where(self) -> RankPlace | None:
        """Where it was: where it waited, for a rank whose collective timed out (its traceback; a stack taken
        later shows it handling the error); else its stack when the job was stopped, or where it raised."""
        if self.error is not None and (self.place is None or self.error.is_collective_timeout):
            return from_traceback(self.rank, self.error.traceback)
        return self.place

    @property
    def is_secondary(self) -> bool:
        """Whether its failure only says that another rank went away first."""
        return self.error is not None and self.error.is_secondary

def log_tail(log_file: str | None) -> str:
    """What a rank that died without a traceback left at the end of its log: the crash report
    faulthandler wrote (a segfault's Python stack), else its last lines."""
    if log_file is None:
        return ""
    try:
        lines = Path(log_file).read_text(errors="backslashreplace").splitlines()
    except OSError:  # none was made, or it cannot be read (a folder in its place)
        return ""
    crash = [i for i, line in enumerate(lines) if line.startswith(_CRASH_REPORT)]
    shown = lines[crash[-1]:][:_LOG_TAIL_LINES] if crash else lines[-_LOG_TAIL_LINES:]
    return "\n".join(shown)
