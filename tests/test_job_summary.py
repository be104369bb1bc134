"""The console lines of a job (`ddpw_runtime.hydra_jobs.summary`): the start line and end summary as a
user sees them (a real run, output to a pipe: no colour; to a terminal: coloured), and the summary of
each kind of failure: the cause in one line and every rank's status (the traceback is in the job's
error, printed once)."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddpw_runtime.errors import JobTimedOut, RankFailure
from ddpw_runtime.hydra_jobs.summary import failed_summary, rank_ranges, rank_statuses, use_colour
from ddpw_runtime.launch.outcome import failure
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RankResult
from tests.helpers import APPS, job_dirs, leftover, run_app, seen

ESC = "\033["


def raised(exc: BaseException) -> BaseException:
    """`exc` with a real traceback."""
    try:
        raise exc
    except BaseException as caught:  # returned to the caller
        return caught


def outcome(rank: int, result: RankResult | None, code: int | None, stopped: bool = False) -> RankOutcome:
    """How rank `rank` ended, as the supervisor records it."""
    signals = frozenset({signal.SIGTERM, signal.SIGKILL}) if stopped else frozenset()
    return RankOutcome(rank, 0, result, code, stopped, signals, log_file=f"rank_{rank}.log")


@pytest.mark.subprocess
def test_a_run_prints_a_start_line_and_a_summary_per_job_without_colour_on_a_pipe(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "behaviour=ok,raise")
    assert proc.returncode != 0
    out = proc.stdout
    assert ESC not in out + proc.stderr
    assert "[ddpw] job #0 started: 2 ranks on cpu, output dir multirun/" in out
    assert "[ddpw] job #1 started: 2 ranks on cpu, output dir multirun/" in out
    completed = [line for line in out.splitlines() if line.startswith("[ddpw] job #0 COMPLETED in ")]
    assert len(completed) == 1 and completed[0].endswith("/0/rank_<k>.log")
    assert ": ranks 0-1 ok; logs multirun/" in completed[0]
    summary = out[out.index("[ddpw] job #1 FAILED after "):out.index("[ddpw] sweep summary")].splitlines()
    assert summary[0].endswith("s: rank 1 failed: ValueError: rank asked to fail")
    assert "  rank 1: FAILED (exit 1)" in summary
    assert any(line.startswith("  rank 0: ") for line in summary)  # stopped, failed too or ok: timing
    assert summary[-1].startswith("  logs: multirun/") and summary[-1].endswith("/1/rank_<k>.log")
    assert 'raise ValueError("rank asked to fail")' not in out  # the traceback is shown once, in the error
    assert proc.stderr.count('raise ValueError("rank asked to fail")') == 1
    table = out[out.index("[ddpw] sweep summary: 2 jobs, 1 COMPLETED, 1 FAILED ("):].splitlines()
    assert table[1].split() == ["job", "status", "time", "rank", "0", "returned", "output", "dir", "overrides"]
    assert table[2].split()[:2] == ["#0", "COMPLETED"] and table[2].endswith("/0  behaviour=ok")
    assert table[3].split()[:2] == ["#1", "FAILED"] and "rank 1 failed: ValueError: rank asked..." in table[3]


@pytest.mark.subprocess
def test_each_line_of_hydra_ddpws_own_is_written_whole_so_no_job_beside_it_splits_it(tmp_path: Path) -> None:
    """Jobs side by side share the console: a job process's stdout is unbuffered, and its start line went out as two
    writes (the text, then its newline), so a line another job echoed between them was glued to its end
    (`... output dir multirun/.../1[job 0] hello from rank 0`). Each write to a SEQPACKET socket is read back alone."""
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with reader:
        with writer:
            proc = subprocess.Popen([sys.executable, str(APPS / "app.py"), "-m", "behaviour=ok,raise"], cwd=tmp_path,
                                    stdout=writer.fileno(), stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        writes = []
        while chunk := reader.recv(1 << 20):
            writes.append(chunk.decode())
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 1, err
    own = [write for write in writes if write.startswith(("[ddpw] job #", "[ddpw] sweep summary"))]
    assert len(own) == 5, writes  # two start lines, a job's end each, the sweep's summary
    assert all(write.endswith("\n") for write in own), own


@pytest.mark.subprocess
def test_a_sweep_whose_output_reader_went_away_runs_every_job(tmp_path: Path) -> None:
    # `python train.py -m ... | head -1`, or `| less` quit: hydra-ddpw's console lines find no reader. Every job still
    # runs (they failed with BrokenPipeError), and the summary file has them; nothing is left running.
    proc = subprocess.Popen([sys.executable, str(APPS / "app.py"), "-m", "behaviour=ok,ok,ok"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader is gone
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    (summary,) = tmp_path.glob("multirun/*/*/sweep_summary.json")
    assert [job["status"] for job in json.loads(summary.read_text())["jobs"]] == ["COMPLETED"] * 3, err
    assert [leftover(seen(job)) for job in job_dirs(tmp_path)] == [[], [], []]
    assert "Error executing job" not in err and "Exception ignored" not in err, err  # (Hydra's logging says its own)


@pytest.mark.subprocess
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


def test_summary_of_a_raised_exception_groups_ranks_and_names_the_cause() -> None:
    own = RankResult.failure(1, raised(ValueError("bad batch")))
    outcomes = [outcome(r, None, -signal.SIGTERM, stopped=True) for r in range(8)]
    outcomes[1] = outcome(1, own, 1)
    failed = failure(outcomes)
    assert isinstance(failed, RankFailure)
    assert rank_statuses(failed)[1] == "FAILED (exit 1)"
    text = failed_summary(3, failed, 12.34, "multirun/x/3")
    assert text.splitlines() == [
        "[ddpw] job #3 FAILED after 12.3 s: rank 1 failed: ValueError: bad batch",
        "  ranks 0, 2-7: stopped (SIGTERM, exit -15)",
        "  rank 1: FAILED (exit 1)",
        "  logs: multirun/x/3/rank_<k>.log",
    ]
    assert ESC not in text
    assert ESC in failed_summary(3, failed, 1.0, "multirun/x/3", colour=True)


def test_summary_names_the_peers_that_failed_after_a_crash_and_the_error_shows_the_crash_report(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rank_1.log"
    log.write_text("hello\nFatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call "
                   'first):\n  File "t.py", line 3 in f\n')
    peer = RankResult.failure(0, raised(RuntimeError("Connection closed by peer")))
    crashed = RankOutcome(1, 0, None, -signal.SIGSEGV, log_file=str(log))
    failed = failure([outcome(0, peer, 1), crashed])
    assert isinstance(failed, RankFailure)
    lines = failed_summary(0, failed, 0.5, "outputs/d").splitlines()
    assert lines[0].endswith("rank 1 failed: RankKilled: killed by SIGSEGV (exit code -11)")
    assert "  rank 0: failed too: RuntimeError (exit 1)" in lines
    assert "  rank 1: FAILED (SIGSEGV, exit -11)" in lines
    # what it wrote just before it crashed, then the crash report
    assert failed.log_tail.splitlines()[:2] == ["hello", "Fatal Python error: Segmentation fault"]
    assert "--- end of rank 1's log ---" in str(failed)


def test_the_end_of_a_crashed_ranks_log_is_shown_as_a_terminal_shows_it(tmp_path: Path) -> None:
    """A progress bar rewritten with '\r' is one line, its last state (its states filled the lines shown, pushing out
    the last words), and a crash report after a line left unfinished is found (it was not: the whole fork's stack was
    shown, from hydra-ddpw's and Hydra's frames up, cut before the task's own frame)."""
    log = tmp_path / "rank_1.log"
    log.write_text("loading shard 17\n" + "".join(f"\rstep {i}/50" for i in range(50)) + "\nno newline here"
                   "Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call first):\n"
                   '  File "train.py", line 3 in step\n  File "/x/ddpw_runtime/procs/rank.py", line 76 in run_rank\n'
                   '  File "train.py", line 25 in <module>\n\nExtension modules: numpy, torch\n')
    failed = failure([outcome(0, RankResult.success(0, None), 0), RankOutcome(1, 0, None, -signal.SIGSEGV,
                                                                              log_file=str(log))])
    assert isinstance(failed, RankFailure)
    assert failed.log_tail.splitlines() == [
        "loading shard 17", "step 49/50", "no newline here", "Fatal Python error: Segmentation fault", "",
        "Current thread 0x7f (most recent call first):", '  File "train.py", line 3 in step']


def test_summary_of_a_rank_that_exited_without_a_traceback_and_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    exited = RankOutcome(0, 0, None, 3, log_file=str(log))
    failed = failure([exited, outcome(1, RankResult.success(1, 3), 0)])
    assert isinstance(failed, RankFailure)
    lines = failed_summary(0, failed, 0.5, "outputs/d").splitlines()
    assert "  rank 0: FAILED (exit 3)" in lines and "  rank 1: ok (exit 0)" in lines
    assert failed.log_tail.splitlines() == [f"line {i}" for i in range(10, 30)]


def test_summary_of_another_error_shows_its_message() -> None:
    timed_out = JobTimedOut(5, {0: "step (t.py:3)", 1: "load (t.py:9)"})
    lines = failed_summary(2, timed_out, 300.0, "o").splitlines()
    assert lines[0] == ("[ddpw] job #2 FAILED after 300.0 s: JobTimedOut: the job ran past its time limit "
                        "(platform.timeout_min=5) and was stopped")  # one clause, not a line left hanging at "...:"
    assert lines[-1] == "  logs: o/rank_<k>.log"


class _ReprOnlyInARank:
    """A task's value whose repr() asks for the rank's state, which the sweep's process does not have."""

    def __repr__(self) -> str:
        raise RuntimeError("not inside a rank")


def test_a_value_whose_repr_fails_in_the_sweeps_process_is_shown_as_such_and_the_summary_is_written(
    tmp_path: Path,
) -> None:
    from hydra.core.utils import JobReturn, JobStatus

    from ddpw_runtime.hydra_jobs.sweep_summary import entry

    ret = JobReturn()
    ret.return_value, ret.status = _ReprOnlyInARank(), JobStatus.COMPLETED
    job = entry(0, ["+kind=local"], tmp_path, 0.1, ret)
    assert job.return_value == "<_ReprOnlyInARank: its repr() failed here: RuntimeError: not inside a rank>"


@pytest.mark.subprocess
def test_a_rank_whose_sigterm_handler_exits_as_the_job_stops_is_listed_as_stopped(tmp_path: Path) -> None:
    """Rank 1 fails; rank 0's checkpoint on SIGTERM ends with `sys.exit(143)` as the stop reaches it: the console listed
    it as `failed too: SystemExit` while its log said it was stopped."""
    proc = run_app(tmp_path, "-m", "behaviour=wait_fail_first_attempt")
    assert proc.returncode == 1
    assert "  rank 0: stopped (exit 1)\n  rank 1: FAILED (exit 1)\n" in proc.stdout, proc.stdout
    (job,) = job_dirs(tmp_path)
    assert "--- rank 0 was stopped: SystemExit: 143" in (job / "rank_0.log").read_text()


@pytest.mark.subprocess
def test_a_callback_that_exits_in_on_job_end_fails_its_job_in_the_summary_and_stops_the_sweep(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "+hydra.callbacks.exits._target_=job_events.ExitsAtJobEnd", "behaviour=ok,raise")
    assert proc.returncode == 3, proc.stderr  # the callback's exit code, as Hydra's own launcher ends with it
    (summary,) = tmp_path.rglob("sweep_summary.json")
    jobs = json.loads(summary.read_text())["jobs"]
    assert [(job["status"], job["error"]) for job in jobs] == [
        ("FAILED", "outside its task: SystemExit: 3"), ("NOT STARTED", None)]
    assert "1 FAILED, 1 NOT STARTED" in proc.stdout
    assert re.search(r"^  #1 +NOT STARTED +- +\S+/1 ", proc.stdout, re.M), proc.stdout  # no time: it never ran
