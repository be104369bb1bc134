"""The console lines of a job (`ddpw_runtime.job_summary`): the start line and end summary as a user
sees them (a real run, output to a pipe: no colour; to a terminal: coloured), and the summary of
each kind of failure."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from ddpw_runtime.job_summary import failed_summary, rank_ranges, rank_statuses, use_colour
from ddpw_runtime.results import JobTimedOut, RankFailure, RankResult
from tests.helpers import APPS, run_app

ESC = "\033["


def raised(exc: BaseException) -> BaseException:
    """`exc` with a real traceback."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - returned to the caller
        return caught


def failure(rank: int, results: List[Optional[RankResult]], exit_codes: Dict[int, int],
            traceback_text: Optional[str] = None) -> RankFailure:
    """A RankFailure as the supervisor builds it, for rank `rank`."""
    own = results[rank]
    error_type, message = (own.error_type, own.error_message) if own else ("RankKilled", "killed by SIGSEGV")
    text = traceback_text if traceback_text is not None else (own.traceback if own else "")
    return RankFailure(rank, 0, exit_codes.get(rank), error_type, message, text, f"rank_{rank}.log", results,
                       exit_codes)


def test_a_run_prints_a_start_line_and_a_summary_per_job_without_colour_on_a_pipe(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "behaviour=ok,raise")
    assert proc.returncode != 0
    out = proc.stdout
    assert ESC not in out + proc.stderr
    assert "[ddpw] job #0 started: 2 ranks on cpu, output dir multirun/" in out
    assert "[ddpw] job #1 started: 2 ranks on cpu, output dir multirun/" in out
    completed = [line for line in out.splitlines() if line.startswith("[ddpw] job #0 COMPLETED in ")]
    assert len(completed) == 1 and completed[0].endswith("/0/rank_<k>.log")
    assert ": ranks 0-1 ok (exit 0); logs multirun/" in completed[0]
    summary = out[out.index("[ddpw] job #1 FAILED after "):].splitlines()
    assert summary[0].endswith("s: rank 1 failed: ValueError: rank asked to fail")
    assert "  rank 1: FAILED (exit 1)" in summary
    assert any(line.startswith("  rank 0: ") for line in summary)  # stopped, failed too or ok: timing
    assert "  traceback of rank 1 (first lines):" in summary
    assert '        raise ValueError("rank asked to fail")' in summary
    assert summary[-1].startswith("  logs: multirun/") and summary[-1].endswith("/1/rank_<k>.log")


def test_a_terminal_gets_colour(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key != "NO_COLOR"}
    with open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(APPS / "app.py")], cwd=tmp_path, stdout=terminal,
                                stderr=stderr, stdin=subprocess.DEVNULL, env={**env, "TERM": "xterm"})
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # the terminal's other side closed: the app has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr.txt").read_text()
    out = b"".join(chunks).decode()
    assert f"{ESC}1mjob #0{ESC}0m started" in out
    assert f"{ESC}32;1mCOMPLETED{ESC}0m" in out


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    controller, terminal = pty.openpty()
    read_end, write_end = os.pipe()
    try:
        with open(terminal, "w", closefd=False) as tty, open(write_end, "w", closefd=False) as pipe:
            monkeypatch.setenv("TERM", "xterm")
            monkeypatch.delenv("NO_COLOR", raising=False)
            assert use_colour(tty) and not use_colour(pipe)
            monkeypatch.setenv("NO_COLOR", "")  # the convention: only a non-empty value counts
            assert use_colour(tty)
            monkeypatch.setenv("NO_COLOR", "1")
            assert not use_colour(tty)
            monkeypatch.delenv("NO_COLOR")
            monkeypatch.setenv("TERM", "dumb")
            assert not use_colour(tty)
    finally:
        for fd in (controller, terminal, read_end, write_end):
            os.close(fd)


def test_rank_ranges() -> None:
    assert rank_ranges([0]) == "0"
    assert rank_ranges([3, 0, 1, 2, 5, 7, 8]) == "0-3, 5, 7-8"


def test_summary_of_a_raised_exception_groups_ranks_and_shows_the_first_traceback_lines() -> None:
    error = raised(ValueError("bad batch"))
    own = RankResult.failure(1, error)
    long_text = "\n".join([own.traceback.rstrip()] + [f"  extra line {i}" for i in range(20)])
    results: List[Optional[RankResult]] = [None, own] + [None] * 6
    codes = {0: -signal.SIGTERM, 1: 1, **{r: -signal.SIGTERM for r in range(2, 8)}}
    failed = failure(1, results, codes, traceback_text=long_text)
    assert rank_statuses(failed)[1] == "FAILED (exit 1)"
    text = failed_summary(3, failed, 12.34, "multirun/x/3")
    lines = text.splitlines()
    assert lines[0] == "[ddpw] job #3 FAILED after 12.3 s: rank 1 failed: ValueError: bad batch"
    assert "  ranks 0, 2-7: stopped (SIGTERM, exit -15)" in lines
    assert "  rank 1: FAILED (exit 1)" in lines
    assert "    Traceback (most recent call last):" in lines
    assert any(line.startswith("    ... (") and line.endswith(" more lines in rank_1.log)") for line in lines)
    assert lines[-1] == "  logs: multirun/x/3/rank_<k>.log"
    assert ESC not in text
    assert ESC in failed_summary(3, failed, 1.0, "multirun/x/3", colour=True)


def test_summary_of_a_crashed_rank_shows_its_crash_report_and_the_peers_that_failed_after_it() -> None:
    peer = RankResult.failure(0, raised(RuntimeError("Connection closed by peer")))
    tail = "\n".join([
        "last lines of rank_1.log:", "hello", "Fatal Python error: Segmentation fault", "",
        "Current thread 0x7f (most recent call first):", '  File "t.py", line 3 in f',
    ])
    failed = failure(1, [peer, None], {0: 1, 1: -signal.SIGSEGV}, traceback_text=tail)
    lines = failed_summary(0, failed, 0.5, "outputs/d").splitlines()
    assert lines[0].endswith("rank 1 failed: RankKilled: killed by SIGSEGV")
    assert "  rank 0: failed too: RuntimeError (exit 1)" in lines
    assert "  rank 1: FAILED (SIGSEGV, exit -11)" in lines
    start = lines.index("  crash report in rank 1's log (first lines):")
    assert lines[start + 1] == "    Fatal Python error: Segmentation fault"
    assert "    hello" not in lines


def test_summary_of_a_rank_that_exited_without_a_traceback_shows_its_last_log_lines() -> None:
    tail = "last lines of rank_0.log:\n" + "\n".join(f"line {i}" for i in range(30))
    failed = failure(0, [None, RankResult.success(1, 3)], {0: 3, 1: 0}, traceback_text=tail)
    lines = failed_summary(0, failed, 0.5, "outputs/d").splitlines()
    assert "  rank 0: FAILED (exit 3)" in lines and "  rank 1: ok (exit 0)" in lines
    start = lines.index("  last lines of rank 0's log:")
    assert lines[start + 1] == "    ... (20 earlier lines in rank_0.log)"
    assert lines[start + 2:start + 12] == [f"    line {i}" for i in range(20, 30)]


def test_summary_of_another_error_shows_its_message() -> None:
    timed_out = JobTimedOut(5, {0: "step (t.py:3)", 1: "load (t.py:9)"})
    lines = failed_summary(2, timed_out, 300.0, "o").splitlines()
    assert lines[0].startswith("[ddpw] job #2 FAILED after 300.0 s: JobTimedOut: the job ran past its")
    assert "    rank 1: load (t.py:9)" in lines
