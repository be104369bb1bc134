"""The console lines of a job: one when it starts, a short summary when it ends.

    [ddpw] job #0 started: 2 ranks on cpu, output dir outputs/2026-11-22/13-29-00
    [ddpw] job #0 COMPLETED in 4.1 s: ranks 0-1 ok (exit 0); logs outputs/2026-11-22/13-29-00/rank_<k>.log

A failed job's summary gives each rank's status and exit code, the rank that failed and the first lines
of its traceback. Plain text, coloured only on a terminal that supports it (see `use_colour`).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional, TextIO

from ddpw_runtime.results import RankFailure, RankResult

PREFIX = "[ddpw]"
TRACEBACK_LINES = 10
"""How many lines of the failed rank's traceback (or log tail) the summary shows."""

_CRASH_REPORT = "Fatal Python error"
_STATUS_COLOURS = {"FAILED": "red", "ok": "green"}
_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33"}


def use_colour(stream: TextIO) -> bool:
    """Whether to colour what goes to `stream`: a terminal, `NO_COLOR` unset (or empty), `TERM` not dumb."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class _Style:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, *names: str) -> str:
        if not self.colour or not names:
            return text
        codes = ";".join(_CODES[name] for name in names)
        return f"\033[{codes}m{text}\033[0m"


def shown_path(path: Path, base: Path) -> str:
    """`path` relative to `base` when it lies under it (shorter on the console), else as it is."""
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return str(path)


def rank_ranges(ranks: List[int]) -> str:
    """`[0, 1, 2, 5]` as `0-2, 5`."""
    spans: List[List[int]] = []
    for rank in sorted(ranks):
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


def _exit_text(code: Optional[int]) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"{signal.Signals(-code).name}, exit {code}"
        except ValueError:
            return f"signal {-code}, exit {code}"
    return f"exit {code}"


def rank_statuses(failure: RankFailure) -> Dict[int, str]:
    """Each rank's status in a failed job, with its exit code: `FAILED` (the root cause), `ok`,
    `failed too` (a failure after the root cause, such as a lost connection), `stopped` (SIGTERM or
    SIGKILL, as the launcher stops the other ranks), `killed` (another signal) or `exited`."""
    results: Dict[int, RankResult] = {r.rank: r for r in failure.results if r is not None}
    statuses = {}
    for rank in sorted(set(failure.exit_codes) | set(results) | {failure.rank}):
        code, result = failure.exit_codes.get(rank), results.get(rank)
        if rank == failure.rank:
            status = "FAILED"
        elif result is not None and result.ok:
            status = "ok"
        elif result is not None:
            status = f"failed too: {result.error_type}"
        elif code in (-signal.SIGTERM, -signal.SIGKILL):
            status = "stopped"
        elif code is not None and code < 0:
            status = "killed"
        else:
            status = "exited"
        statuses[rank] = f"{status} ({_exit_text(code)})"
    return statuses


def _head(style: _Style, job: int, what: str, *colours: str) -> str:
    """`[ddpw] job #N <what>`, `what` in `colours`."""
    return f"{style(PREFIX, 'dim')} {style(f'job #{job}', 'bold')} {style(what, *colours)}"


def start_line(job: int, world_size: int, device: str, output_dir: str, colour: bool = False) -> str:
    """The line printed when a job's ranks start."""
    ranks = f"{world_size} rank" + ("s" if world_size != 1 else "")
    return f"{_head(_Style(colour), job, 'started')}: {ranks} on {device}, output dir {output_dir}"


def completed_summary(job: int, world_size: int, duration_s: float, log_dir: str, colour: bool = False) -> str:
    """The line printed when every rank of a job returned (each exited 0)."""
    style = _Style(colour)
    ranks = ("ranks " if world_size > 1 else "rank ") + rank_ranges(list(range(world_size)))
    return (
        f"{_head(style, job, 'COMPLETED', 'green', 'bold')} in {duration_s:.1f} s: "
        f"{ranks} {style('ok', 'green')} (exit 0); logs {log_dir}/rank_<k>.log"
    )


def failed_summary(job: int, error: BaseException, duration_s: float, log_dir: str, colour: bool = False) -> str:
    """The lines printed when a job failed: for a `RankFailure`, each rank's status and exit code, the
    rank that failed and the first lines of its traceback; else the error itself."""
    style = _Style(colour)
    head = f"{_head(style, job, 'FAILED', 'red', 'bold')} after {duration_s:.1f} s: "
    if not isinstance(error, RankFailure):
        message = str(error).splitlines() or [""]
        lines = [head + type(error).__name__ + (f": {message[0]}" if message[0] else "")]
        lines += [f"  {line}" for line in message[1:TRACEBACK_LINES]]
        lines.append(f"  logs: {log_dir}/rank_<k>.log")
        return "\n".join(lines)
    cause = f"{error.error_type}: {error.error_message}" if error.error_message else error.error_type
    lines = [head + f"rank {error.rank} failed: {cause}"]
    by_status: Dict[str, List[int]] = {}
    for rank, status in rank_statuses(error).items():
        by_status.setdefault(status, []).append(rank)
    for status, ranks in sorted(by_status.items(), key=lambda item: item[1][0]):
        label = ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
        lines.append(f"  {label}: {style(status, _STATUS_COLOURS.get(status.split()[0], 'yellow'))}")
    lines += _traceback_lines(error, style)
    lines.append(f"  logs: {log_dir}/rank_<k>.log")
    return "\n".join(lines)


def _traceback_lines(failure: RankFailure, style: _Style) -> List[str]:
    """The first lines of the failed rank's traceback; for a rank that died without one, the last
    lines of its log (where a crash leaves its message)."""
    text = failure.traceback_text.rstrip().splitlines()
    if not text:
        return []
    log_name = f"rank_{failure.rank}.log"
    if text[0].startswith("last lines of "):
        text = text[1:]
        crash = [i for i, line in enumerate(text) if line.startswith(_CRASH_REPORT)]
        if crash:  # faulthandler's report, most recent call first: its first lines say the most
            text = text[crash[-1]:]
            return _first_lines(f"crash report in rank {failure.rank}'s log", text, log_name, style)
        shown = text[-TRACEBACK_LINES:]
        lines = [f"  last lines of rank {failure.rank}'s log:"]
        if len(text) > len(shown):
            lines.append(f"    ... ({len(text) - len(shown)} earlier lines in {log_name})")
        return lines + [f"    {style(line, 'dim')}" for line in shown]
    return _first_lines(f"traceback of rank {failure.rank}", text, log_name, style)


def _first_lines(title: str, text: List[str], log_name: str, style: _Style) -> List[str]:
    shown = text[:TRACEBACK_LINES]
    lines = [f"  {title} (first lines):"] + [f"    {style(line, 'dim')}" for line in shown]
    if len(text) > len(shown):
        lines.append(f"    ... ({len(text) - len(shown)} more lines in {log_name})")
    return lines


class JobConsole:
    """Prints one job's start line and end summary to `out` (stdout by default, where Hydra logs)."""

    def __init__(self, job: int, world_size: int, device: str, output_dir: Path, base: Path,
                 out: Optional[TextIO] = None) -> None:
        self.job = job
        self.world_size = world_size
        self.device = device
        self.output_dir = shown_path(output_dir, base)
        self.out = out if out is not None else sys.stdout
        self.colour = use_colour(self.out)

    def started(self) -> None:
        """Print the start line."""
        self._print(start_line(self.job, self.world_size, self.device, self.output_dir, self.colour))

    def completed(self, duration_s: float) -> None:
        """Print the summary of a job whose every rank returned."""
        self._print(completed_summary(self.job, self.world_size, duration_s, self.output_dir, self.colour))

    def failed(self, error: BaseException, duration_s: float) -> None:
        """Print the summary of a failed job."""
        self._print(failed_summary(self.job, error, duration_s, self.output_dir, self.colour))

    def _print(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
