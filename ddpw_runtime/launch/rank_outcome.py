"""How one rank of a job ended (`RankOutcome`), as plain data every supervising process and node hands on (the root
cause among them: `outcome.py`)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from ddpw_runtime.launch.records import COLLECTIVE_TIMEOUT_MARKERS, RaisedError, RankResult
from ddpw_runtime.launch.stacks import RankPlace, ends_in_a_dump, from_crash_report, from_traceback, last_dump

LOG_TAIL_LINES = 20  # the most lines of a log's end an error shows
_CRASH_REPORT = "Fatal Python error"  # how faulthandler's report in a crashed rank's log starts
_BEFORE_CRASH_LINES = 5
_OWN_FRAME = f"{os.sep}ddpw_runtime{os.sep}"  # hydra-ddpw's frames in a crash report, which say nothing of the crash
_MODULES_LINE = "Extension modules:"  # faulthandler's list of loaded extension modules: hundreds of names
_EXIT_NOTE = re.compile(r"\n--- rank \d+ failed: (?:RankExited|RankKilled|RankLost): [^\n]*\n$")
"""How a rank that sent no result ended, as `note_failures` wrote it at the end of its log (the error says it too)."""
_RAISED_BY_A_STOP = ("KeyboardInterrupt", "SystemExit", "ddpw_runtime.errors.RankStopped")
"""What a rank's task raises when the job stops it (Ctrl-C, a SIGTERM handler's exit, rank 0 in the user's process)."""
_LOG_END_BYTES = 1 << 16  # read of a dead rank's log end (NCCL's watchdog writes its timeout, C++ stacks, then aborts)
_RUN_START = re.compile(r"^--- [\d: -]+: (?:restart \d+ of \d+: the job starts again|a new run of the job starts "
                        r"\(above: an earlier run's output\)) ---$", re.MULTILINE)
"""The line `run_start` writes: a log's end shown for this run starts below the last one."""


def run_start(when: str, restart_count: int, max_restarts: int) -> str:
    """The line that marks where a run of the job starts in a rank log that holds an earlier run's output (a restart,
    a `Wrapper`'s fixed `log_dir`, a sweep's job run again)."""
    run = (f"restart {restart_count} of {max_restarts}: the job starts again" if restart_count else
           "a new run of the job starts (above: an earlier run's output)")
    return f"--- {when}: {run} ---\n"


@dataclass
class RankOutcome:
    """How one rank ended."""

    rank: int
    node: int
    result: RankResult | None  # what the rank sent back; None when it sent nothing (killed, crashed, exited early)
    exit_code: int | None  # negative: the signal that killed it; None: in the caller's process, or its end unseen
    stopped: bool = False  # the launcher stopped it: it still ran when the job was stopped or interrupted
    signals_sent: frozenset[int] = frozenset()  # what the launcher sent the job's ranks (explains exits by them)
    ended_at: float = field(default_factory=time.time)
    log_file: str | None = None
    place: RankPlace | None = None  # where it was when the job was stopped, from its stack (None: it had ended)
    stopped_at: float | None = None  # when (`time.time`) the stop's first signal reached it

    @property
    def error(self) -> RaisedError | None:
        """What it raised, as it sent it back."""
        return self.result.error if self.result is not None else None

    @property
    def failed(self) -> bool:
        """Whether the rank did not return a value and end cleanly (a stop that ended it after its task returned, as it
        exited, is no failure: its task was done)."""
        return self.result is None or not self.result.ok or (self.exit_code not in (0, None) and not self.stopped)

    @property
    def own_failure(self) -> bool:
        """Whether the rank failed by itself, not stopped by the launcher; with no result, an exit no signal sent
        explains is its own (a segfault whose peer's "connection closed" came first, while it counted as stopped)."""
        if self.result is not None and not self.result.ok:
            return True
        if self.result is None and self.exit_code is not None and -self.exit_code not in self.signals_sent:
            return True
        return not self.stopped

    @property
    def ended_by_the_stop(self) -> bool:
        """Whether the job's stop (Ctrl-C, another rank's failure) ended it: it was stopped and raised nothing but what
        a stop raises, after the stop came; a rank the stop reached after it had raised an error of its own (a
        `sys.exit(4)` in its task too) failed."""
        if not self.stopped or self.result is None or self.result.error is None:
            return self.stopped
        before = self.stopped_at is not None and self.result.finished_at < self.stopped_at
        return self.result.error.type_name in _RAISED_BY_A_STOP and not before

    @property
    def timed_out_in_collective(self) -> bool:
        """Whether a collective it waited in timed out (gloo's error, or NCCL's watchdog in its log)."""
        if self.error is not None:
            return self.error.is_collective_timeout
        return self.result is None and timeout_line(self.log_file) is not None

    def where(self) -> RankPlace | None:
        """Where it was: where it waited if its collective timed out or failed as a peer went away (its traceback: a
        later stack shows it handling the error, or ending: hydra-ddpw's frames); else its stack when stopped, or where
        it raised; if it died (NCCL's watchdog), its crash report's."""
        if self.error is not None and (self.place is None or self.error.is_collective_timeout or self.is_secondary):
            return from_traceback(self.rank, self.error.traceback)
        if self.place is None and self.result is None:  # the last crash report at the end of its log
            lines = _log_lines(self.log_file)
            start = _report_start(lines)
            return from_crash_report(self.rank, lines[start:] if start is not None else [])
        return self.place

    @property
    def is_secondary(self) -> bool:
        """Whether its failure only says that another rank went away first."""
        return self.error is not None and self.error.is_secondary


def timeout_line(log_file: str | None) -> str | None:
    """The last line of a dead rank's log that says its collective timed out (NCCL's watchdog); None if none does."""
    lines = [line for line in _log_lines(log_file) if any(m in line for m in COLLECTIVE_TIMEOUT_MARKERS)]
    return lines[-1].strip() if lines else None


def _log_lines(log_file: str | None) -> list[str]:
    """The lines at the end of a rank's log, below the last `run_start` line (this run of its job), as a terminal
    shows them: a line rewritten with '\r' (a progress bar) as its last state, one line however often it was
    rewritten; a crash report after a line left unfinished (a print without a newline, C output left in a buffer) on
    a line of its own."""
    text = _log_end(log_file)
    text = text[max((start.end() + 1 for start in _RUN_START.finditer(text)), default=0):]  # this run's only
    text = re.sub(f"(?<=[^\n]){_CRASH_REPORT}", f"\n{_CRASH_REPORT}", _EXIT_NOTE.sub("", text))
    text = text.removesuffix("\n")
    return [line.rstrip("\r").rpartition("\r")[2] for line in text.split("\n")] if text else []


def _log_end(log_file: str | None) -> str:
    """The last `_LOG_END_BYTES` of a rank's log ('' when there is none, or it cannot be read)."""
    if log_file is None:
        return ""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(0, log.seek(0, 2) - _LOG_END_BYTES))
            return log.read().decode(errors="backslashreplace")
    except OSError:  # none was made, or it cannot be read (a folder in its place)
        return ""


def log_tail(log_file: str | None) -> str:
    """The end of a rank's log that died without a traceback: its last words and faulthandler's crash report (a
    segfault's, or the stacks of an exit past its time) down to the frame that called the task or handler; else its last
    lines."""
    lines = _log_lines(log_file)
    start = _report_start(lines)
    if start is None:
        return "\n".join(lines[-LOG_TAIL_LINES:])
    before = [line for line in lines[max(0, start - _BEFORE_CRASH_LINES):start] if line.strip()]
    crash, below_the_task = [], False
    for line in _current_thread_first(lines[start:]):
        frame = line.startswith("  File ")
        below_the_task = frame and (below_the_task or _OWN_FRAME in line)  # (each thread's stack anew)
        if not below_the_task and not line.startswith(_MODULES_LINE):
            crash.append(line)
    return "\n".join([*before, *crash[:LOG_TAIL_LINES]])


def _current_thread_first(report: list[str]) -> list[str]:
    """faulthandler's `report` with the stack of the thread that crashed or was signalled ('Current thread', listed
    after the threads started later: a DataLoader's, a tracker's) before the other threads', so that the end of the log
    shown, which is cut, holds it."""
    threads = last_dump(report)
    current = next((i for i in threads if report[i].startswith("Current thread")), None)
    if current is None or current == threads[0]:
        return report
    end = next((i for i in threads if i > current), len(report))
    return [*report[:threads[0]], *report[current:end], *report[threads[0]:current], *report[end:]]


def _report_start(lines: list[str]) -> int | None:
    """Where the last crash report in a rank's log `lines` starts: faulthandler's fatal error (a segfault, an abort),
    or the stacks dump that ends the log (a rank whose exit ran past its time); None when there is none."""
    starts = [i for i, line in enumerate(lines) if line.startswith(_CRASH_REPORT)]
    return starts[-1] if starts else ends_in_a_dump(lines)
