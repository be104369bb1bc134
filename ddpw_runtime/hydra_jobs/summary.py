"""The console lines of a job: one when it starts, a short summary when it ends.

    [ddpw] job #0 started: 2 ranks on cpu, output dir outputs/2026-11-22/13-29-00
    [ddpw] job #0 COMPLETED in 4.1 s: ranks 0-1 ok; logs outputs/2026-11-22/13-29-00/rank_<k>.log

A failed job's summary gives the root cause in one line and each rank's status and exit code (the traceback is in
the job's error, which Hydra prints once). A job started again (`hydra.launcher.max_restarts`) says so:
`COMPLETED in 9.3 s after 1 restart: ...`, `FAILED after 9.3 s (attempt 3 of 3): ...`. Coloured only on a terminal
that supports it (`use_colour`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ddpw_conf import Platform
from ddpw_runtime.errors import JobTimedOut, RankFailure
from ddpw_runtime.launch.console import show
from ddpw_runtime.launch.job import NodeJob
from ddpw_runtime.launch.outcome import signal_name
from ddpw_runtime.launch.stacks import rank_ranges

PREFIX = "[ddpw]"
_STATUS_COLOURS = {"FAILED": "red", "NOT": "red", "ok": "green"}
_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33"}


def use_colour(stream: TextIO) -> bool:
    """Whether to colour what goes to `stream`: a terminal, `NO_COLOR` unset (or empty), `TERM` not dumb."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _style(colour: bool, text: str, *names: str) -> str:
    """`text` in the colours `names`, when `colour`."""
    if not colour or not names:
        return text
    return f"\033[{';'.join(_CODES[name] for name in names)}m{text}\033[0m"


def shown_path(path: Path, base: Path) -> str:
    """`path` relative to `base` when it lies under it (shorter on the console), else as it is."""
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return str(path)


def rank_statuses(failure: RankFailure) -> dict[int, str]:
    """Each rank's status in a failed job, with its exit code: `FAILED` (the root cause; `NOT IN THE COLLECTIVE` and
    `waited in the collective` when a collective timed out; `ENDED EARLY` for a task that returned while its peers
    waited), `ok`, `failed too` (after the root cause), `stopped` (by the launcher), `killed` or `exited`."""
    statuses = {}
    hang = failure.hang
    for outcome in failure.outcomes:
        result, code = outcome.result, outcome.exit_code
        if hang is not None and outcome.rank in hang.culprits:
            status = "NOT IN THE COLLECTIVE"
        elif hang is not None and outcome.rank in hang.waiting:
            status = "waited in the collective"
        elif outcome.rank == failure.rank:
            status = "ENDED EARLY" if failure.error_type == "EndedEarly" else "FAILED"
        elif result is not None and result.ok and code in (0, None):
            status = "ok"
        elif result is not None and result.error is not None and not outcome.ended_by_the_stop:
            status = f"failed too: {result.error.type_name}"
        elif outcome.stopped:
            status = "stopped"
        elif code is not None and code < 0:
            status = "killed"
        else:
            status = "exited"
        if code is not None:  # None: it ran in the launching process, or its end was never seen
            status += f" ({signal_name(-code)}, exit {code})" if code < 0 else f" (exit {code})"
        statuses[outcome.rank] = status
    return statuses


def _head(colour: bool, job: int, what: str, *colours: str) -> str:
    """`[ddpw] job #N <what>`, `what` in `colours`."""
    return f"{_style(colour, PREFIX, 'dim')} {_style(colour, f'job #{job}', 'bold')} {_style(colour, what, *colours)}"


def counted(count: int, noun: str) -> str:
    """`1 restart`, `2 restarts`."""
    return f"{count} {noun}" + ("s" if count != 1 else "")


def failed_summary(job: int, error: BaseException, duration_s: float, log_dir: str | None, colour: bool = False,
                   restarts: int = 0, max_restarts: int = 0) -> str:
    """The lines printed when a job failed: the cause in one line (after a restart, which attempt failed: `restarts`
    of `max_restarts`) and, for a `RankFailure`, each rank's status; for a `JobTimedOut`, where each rank was; where
    its logs are (`log_dir`; None: it never started)."""
    # (SLURM may requeue a job on its own, a node failure: past `max_restarts`)
    attempt = f" (attempt {restarts + 1} of {max(restarts, max_restarts) + 1})" if restarts else ""
    head = f"{_head(colour, job, 'FAILED', 'red', 'bold')} after {duration_s:.1f} s{attempt}: "
    lines = [head + one_line(error)]
    if isinstance(error, RankFailure):
        by_status: dict[str, list[int]] = {}
        for rank, status in rank_statuses(error).items():
            by_status.setdefault(status, []).append(rank)
        for status, ranks in sorted(by_status.items(), key=lambda item: item[1][0]):
            label = ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
            lines.append(f"  {label}: {_style(colour, status, _STATUS_COLOURS.get(status.split()[0], 'yellow'))}")
    elif isinstance(error, JobTimedOut):  # where each rank was: in a sweep, only the first failed job's error is shown
        lines += [f"  {line}" for line in error.places]
    if log_dir is not None:
        lines.append(f"  logs: {log_dir}/rank_<k>.log")
    return "\n".join(lines)


def one_line(error: BaseException) -> str:
    """Why a job failed, in one line: the root cause of a `RankFailure`, what a `JobTimedOut` stopped and the rank that
    held up the others, else `Type: first line`."""
    if isinstance(error, RankFailure):
        return f"rank {error.rank} failed: {error.cause}"
    if isinstance(error, JobTimedOut):
        report = error.report
        held = [place for place in report.places if place.rank in report.culprits] if report is not None else []
        by = (f"; rank {held[0].rank} held up the others, at {held[0].where()}" if len(held) == 1 else
              f"; ranks {rank_ranges([place.rank for place in held])} held up the others" if held else "")
        return f"JobTimedOut: {error.head}{by}"
    message = str(error).splitlines()
    return type(error).__name__ + (f": {message[0]}" if message and message[0] else "")


class JobConsole:
    """Prints one job's start line and end summary to stdout (where Hydra logs)."""

    def __init__(self, job: int, platform: Platform, output_dir: Path, base: Path) -> None:
        self.job, self.world_size, self.device = job, platform.world_size, platform.device
        self.output_dir = shown_path(output_dir, base)
        self.out = sys.stdout
        self.colour = use_colour(self.out)
        self.restarts = self.max_restarts = 0

    def attempt(self, job: NodeJob) -> None:
        """Note that an attempt of the job (`job.restart_count`) starts: the summary says which one it ended with."""
        self.restarts, self.max_restarts = job.restart_count, job.max_restarts

    @contextmanager
    def shown(self) -> Iterator[None]:
        """Print the job's start line, and as the block ends its summary: completed, or failed (raised on)."""
        show(f"{_head(self.colour, self.job, 'started')}: {counted(self.world_size, 'rank')} on {self.device}, "
             f"output dir {self.output_dir}", self.out)
        started = time.monotonic()
        try:
            yield
        except Exception as error:
            show(failed_summary(self.job, error, time.monotonic() - started, self.output_dir, self.colour,
                                self.restarts, self.max_restarts), self.out)
            raise
        ranks = ("ranks " if self.world_size > 1 else "rank ") + rank_ranges(list(range(self.world_size)))
        after = f" after {counted(self.restarts, 'restart')}" if self.restarts else ""
        show(f"{_head(self.colour, self.job, 'COMPLETED', 'green', 'bold')} in {time.monotonic() - started:.1f} s"
             f"{after}: {ranks} {_style(self.colour, 'ok', 'green')}; logs {self.output_dir}/rank_<k>.log", self.out)
