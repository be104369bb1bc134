"""The local launcher end to end: the test app run as a user runs it, real ranks, real gloo."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpw_runtime.launch.console import ConsoleEcho, PipeCopy
from tests.helpers import APPS, job_dirs, leftover, run_app, seen

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def test_run_mode_starts_two_ranks_in_the_normal_output_dir(tmp_path: Path) -> None:
    proc = run_app(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert job.relative_to(tmp_path).parts[0] == "outputs"  # where a plain run puts it
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    for rank, data in ranks.items():
        assert data["world_size"] == 2 and data["all_reduce_world"] == 2.0
        assert data["env"]["RANK"] == str(rank) and data["env"]["LOCAL_RANK"] == str(rank)
        assert data["env"]["WORLD_SIZE"] == "2" and data["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert data["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert data["output_dir"] == str(job)
        assert data["device"] == "cpu"
    assert ranks[0]["env"]["MASTER_PORT"] == ranks[1]["env"]["MASTER_PORT"]
    assert not (tmp_path / "multirun").exists()
    assert leftover(ranks) == []


def test_each_rank_logs_to_its_own_file_and_console_shows_rank_0(tmp_path: Path) -> None:
    proc = run_app(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    for rank in (0, 1):
        text = (job / f"rank_{rank}.log").read_text()
        assert f"hello from rank {rank}" in text
        assert f"raw fd write from rank {rank}" in text  # output below Python lands there too
    assert "hello from rank 0" in proc.stdout
    assert "hello from rank 1" not in proc.stdout + proc.stderr
    assert len(list(job.glob("*.log"))) == 3  # app.log once, plus one per rank
    assert (job / ".hydra" / "config.yaml").exists()


def test_console_ranks_all_prefixes_each_line_with_its_rank(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "platform.console_ranks=all")
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] hello from rank 0" in proc.stdout
    assert "[rank 1] hello from rank 1" in proc.stdout


def test_multirun_sweeps_world_sizes_per_job(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "platform.n_procs_per_node=1,2,3")
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1", "2"]
    assert all(job.relative_to(tmp_path).parts[0] == "multirun" for job in jobs)
    for job, size in zip(jobs, (1, 2, 3), strict=True):
        ranks = seen(job)
        assert sorted(ranks) == list(range(size))
        assert {r["world_size"] for r in ranks.values()} == {size}
        assert {r["all_reduce_world"] for r in ranks.values()} == {float(size)}


def test_ipc_groups_put_every_rank_in_its_group(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "platform.n_procs_per_node=4", "platform.ipc_groups=[[0,2],[1,3]]")
    assert proc.returncode == 0, proc.stderr
    ranks = seen(job_dirs(tmp_path)[0])
    assert {r: ranks[r]["group_rank_sum"] for r in ranks} == {0: 2.0, 2: 2.0, 1: 4.0, 3: 4.0}


def test_job_chdir_is_respected_in_every_rank(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "hydra.job.chdir=true")
    assert proc.returncode == 0, proc.stderr
    job = job_dirs(tmp_path)[0]
    assert {r["cwd"] for r in seen(job).values()} == {str(job)}
    proc = run_app(tmp_path, "hydra.job.chdir=false")
    assert {r["cwd"] for r in seen(job_dirs(tmp_path)[-1]).values()} == {str(tmp_path)}


def test_cpu_threads_are_split_across_ranks(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "platform.n_cpus_per_node=2")  # 2 ranks: one thread each
    assert proc.returncode == 0, proc.stderr
    assert {r["threads"] for r in seen(job_dirs(tmp_path)[0]).values()} == {1}


@pytest.mark.parametrize(
    "behaviour, expected",
    [
        ("raise", ["rank 1 (node 0) failed: ValueError: rank asked to fail", 'raise ValueError("rank asked to fail")']),
        ("exit", ["rank 1 (node 0) failed: RankExited: exited with code 3"]),
        # (the other rank, its task over, waited for it in hydra-ddpw's own end of the job: the job hung)
        ("exit_0", ["rank 1 (node 0) failed: RankLost: exited with code 0 but sent no result"]),
        # (the rank's traceback starts at the task's own frame, as for any other exception)
        ("sysexit", ["rank 1 (node 0) failed: SystemExit: 4",
                     f'Traceback (most recent call last):\n  File "{APPS}/app.py"']),
        ("kill", ["rank 1 (node 0) failed: RankKilled: killed by SIGKILL"]),
        # (the crashing thread's stack, which faulthandler lists after the threads started later, shown first)
        ("segfault", ["rank 1 (node 0) failed: RankKilled: killed by SIGSEGV",
                      "Fatal Python error: Segmentation fault\n\nCurrent thread 0x",
                      f' in string_at\n  File "{APPS}/app.py", line ']),
        # (what it said just before, which the end of its log shown started after)
        ("abort_after_saying", ["rank 1 (node 0) failed: RankKilled: killed by SIGABRT",
                                "shard 17 is corrupted\nFatal Python error: Aborted",
                                f' in misbehave\n  File "{APPS}/app.py", line ', " in main\n(full output of rank 1"]),
    ],
)
def test_a_failing_rank_fails_the_job_with_its_cause(tmp_path: Path, behaviour: str, expected: list) -> None:
    proc = run_app(tmp_path, f"behaviour={behaviour}")
    assert proc.returncode != 0
    for text in expected:
        assert text in proc.stderr, proc.stderr
    job = job_dirs(tmp_path)[0]
    # how it ended ends its log, a rank that sent no result too (its log just ended), and only there
    assert f"--- {expected[0].replace(' (node 0)', '')}" in (job / "rank_1.log").read_text()
    assert "--- rank 1 failed" not in proc.stderr
    assert leftover(seen(job)) == []


@pytest.mark.parametrize("mode", [(), ("-m",)], ids=["plain", "multirun"])
def test_an_error_with_a_message_of_many_lines_is_named_in_one_line_and_shown_once(tmp_path: Path,
                                                                                   mode: tuple[str, ...]) -> None:
    """A DataLoader worker's error: torch raises it again with the worker's whole traceback in its message."""
    proc = run_app(tmp_path, *mode, "behaviour=worker_raise")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    head = "rank 1 failed: ValueError: Caught ValueError in DataLoader worker process 0.\n  rank 0: "  # one line
    assert "[ddpw] job #0 FAILED after" in console and head in console, console
    assert "rank 1 (node 0) failed: ValueError: Caught ValueError in DataLoader worker process 0.\n--- traceback" \
        in console, console
    assert console.count("Original Traceback") == 1 and console.count('raise ValueError("item 3 cannot') == 1, console


def test_rank_0_failing_is_reported_as_rank_0(tmp_path: Path) -> None:
    # A plain run's rank 0 is the user's own process: Hydra reports its error as in any plain run.
    proc = run_app(tmp_path, "behaviour=raise", "fail_rank=0")
    assert proc.returncode == 1
    assert 'raise ValueError("rank asked to fail")\nValueError: rank asked to fail' in proc.stderr
    assert "rank 0 failed: ValueError: rank asked to fail" in proc.stdout  # the job's summary
    proc = run_app(tmp_path, "-m", "behaviour=raise", "fail_rank=0")
    assert proc.returncode == 1
    assert "rank 0 (node 0) failed: ValueError: rank asked to fail" in proc.stderr


def test_multirun_reports_the_failed_job(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "behaviour=ok,raise")
    assert proc.returncode != 0
    assert "rank 1 (node 0) failed: ValueError" in proc.stderr
    first, second = job_dirs(tmp_path)
    assert sorted(seen(first)) == [0, 1] and sorted(seen(second)) == [0, 1]


def test_script_without_main_guard_runs_once(tmp_path: Path) -> None:
    proc = run_app(tmp_path, app="app_no_guard.py")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)  # ranks did not run the Hydra app again
    assert sorted(seen(job)) == [0, 1]


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "hydra.launcher.dry_run=true", "platform.n_procs_per_node=3")
    assert proc.returncode == 0, proc.stderr
    assert "world size      : 3 (1 node(s) x 3 rank(s))" in proc.stdout
    assert "backend         : gloo" in proc.stdout
    # No port is chosen before the job starts: the dry run showed one picked for it, which the job would not use.
    assert "rendezvous      : tcp://127.0.0.1 (a free port, chosen when the job starts)\n" in proc.stdout, proc.stdout
    assert not any(tmp_path.rglob("rank_*.log"))
    proc = run_app(tmp_path, "hydra.launcher.dry_run=true", "platform.master_port=29123")
    assert "rendezvous      : tcp://127.0.0.1:29123\n" in proc.stdout, proc.stdout
    proc = run_app(tmp_path, "-m", "hydra.launcher.dry_run=true", "platform.ipc_protocol=file")
    assert "rendezvous      : file://<private dir>/rendezvous\n" in proc.stdout, proc.stdout


def test_the_dry_run_shows_the_threads_per_rank_an_omp_num_threads_set_gives_the_ranks(tmp_path: Path) -> None:
    """`OMP_NUM_THREADS` in the shell, or in `hydra.job.env_set`, is what the ranks use: the dry run showed the
    split's 1 instead."""
    def app(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(APPS / "app.py"), *overrides], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "3"})
    assert "threads per rank: 3 (OMP_NUM_THREADS)\n" in app("hydra.launcher.dry_run=true").stdout
    assert app().returncode == 0
    assert [data["threads"] for data in seen(job_dirs(tmp_path)[0]).values()] == [3, 3]  # as shown
    proc = run_app(tmp_path, "-m", "hydra.launcher.dry_run=true", "+hydra.job.env_set.OMP_NUM_THREADS=2")
    assert "threads per rank: 2 (OMP_NUM_THREADS)\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", [(), ("-m", "platform.exit_timeout_min=52560000"), ("platform.spawn_method=spawn",)],
                         ids=["plain", "multirun", "spawn"])
def test_every_rank_ends_as_python_does_its_exit_handlers_run_and_the_files_it_left_open_keep_what_it_wrote(
        tmp_path: Path, mode: tuple[str, ...]) -> None:
    """As under torchrun, where each rank is a process that Python ends: its `atexit` handlers run, and what a file it
    left open holds back is written (a gzip file's end too). Ranks ended with `os._exit`, and a plain run's rank 0
    (its heap frozen at the fork) freed nothing as Python ended: every such file was empty. (The multirun allows the
    longest exit a platform takes, 100 years: more seconds than the kernel's alarm holds.)"""
    proc = run_app(tmp_path, *mode, "behaviour=leave_open")
    assert proc.returncode == 0, proc.stderr
    job = job_dirs(tmp_path)[0]
    for rank in (0, 1):
        assert (job / f"open_rank_{rank}.txt").read_text() == "kept\n"
        with gzip.open(job / f"open_rank_{rank}.gz", "rt") as zipped:
            assert zipped.read() == "kept\n"
        assert (job / f"atexit_rank_{rank}.txt").read_text() == "ran\n"


_SWEEP_LEAVES_OPEN = """
import atexit, gzip, sys
import hydra

class Holder:  # in a reference cycle: only a garbage collection as Python ends would close its file
    def __init__(self, path):
        self.me, self.file = self, gzip.open(path, "wt")

HELD = Holder("sweep.gz")
HELD.file.write("written in the sweep's process\\n")
atexit.register(print, "an exit handler registered before the sweep ran")

@hydra.main(version_base=None)
def main(cfg):
    return 0

if __name__ == "__main__":
    main()
"""


def test_a_multiruns_own_process_ends_as_python_does_exit_handlers_run_and_files_left_open_keep_what_it_wrote(
        tmp_path: Path) -> None:
    """The Hydra process of a multirun (the user's own) skips the last garbage collections as it ends (0.4 to 0.7 s with
    torch loaded): every exit handler still runs, and a file left open in a reference cycle, which only those
    collections would have closed, still keeps what was written to it (a gzip file's end too)."""
    (tmp_path / "sweep_app.py").write_text(_SWEEP_LEAVES_OPEN)
    proc = subprocess.run([sys.executable, "sweep_app.py", "-m", "hydra/launcher=ddpw_cpu",
                           "platform.n_procs_per_node=1", "+x=1,2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "an exit handler registered before the sweep ran" in proc.stdout
    with gzip.open(tmp_path / "sweep.gz", "rt") as zipped:
        assert zipped.read() == "written in the sweep's process\n"


@pytest.mark.parametrize("mode", [("fail_rank=1",), ("-m", "fail_rank=0")], ids=["plain", "multirun"])
def test_a_rank_whose_exit_handler_hangs_is_ended_and_named_with_the_handlers_line(
        tmp_path: Path, mode: tuple[str, ...]) -> None:
    """A rank's task returned, then an exit handler of its own hung (a tracker's upload): at the bound the user set
    (`platform.exit_timeout_min`, here 2 s) the rank is ended, and the job fails naming it and why, with the handler's
    frame. It read `RankKilled: killed by SIGALRM` with the bottom of its stack: Hydra's frames, down to `main()`."""
    proc = run_app(tmp_path, *mode, "behaviour=hang_at_exit", "platform.exit_timeout_min=0.03")
    assert proc.returncode == 1
    rank = mode[-1][-1]
    assert f"rank {rank} (node 0) failed: HungAtExit: its task returned, then it did not end within " \
           "platform.exit_timeout_min: an atexit handler" in proc.stderr, proc.stderr
    # The job's error and its one-line status show the message whole, its fix included (no traceback below shows it).
    (headline,) = [line for line in proc.stderr.splitlines() if line.startswith(f"rank {rank} (node 0) failed: ")]
    assert "took longer (raise platform.exit_timeout_min if so)" in headline, headline
    assert "characters more" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    tail = proc.stderr.split(f"--- end of rank {rank}'s log ---\n")[1]
    assert re.search(r'\nCurrent thread 0x[0-9a-f]+ \(most recent call first\):\n  File "[^"]*app.py", line \d+ in '
                     r"upload_at_exit\n\(full output", tail), tail  # (after its last words; nothing of hydra-ddpw's)


@pytest.mark.parametrize(("mode", "early"), [((), 1), (("-m",), 1), (("-m",), 0)],
                         ids=["plain", "multirun", "multirun-rank-0"])
def test_a_rank_whose_task_returns_while_the_others_wait_for_it_is_named_as_the_cause(
        tmp_path: Path, mode: tuple[str, ...], early: int) -> None:
    """Uneven data across ranks: one rank returns while the other waits for it in a collective, which then fails on the
    closed connection. The waiting rank was named, with only gloo's "Connection closed by peer". Rank 0 returning
    early held the job's store until every rank was done with it, so its peer waited out the collective timeout
    (30 minutes by default, and this test's timeout)."""
    proc = run_app(tmp_path, *mode, "behaviour=ended_early", f"fail_rank={early}")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    waiting = 1 - early
    assert f"rank {early} (node 0) failed: EndedEarly: its task returned while rank {waiting} still waited for it in " \
           "a collective at main (" in console, console
    assert "every rank must enter the same collectives" in console
    assert f"what a waiting rank raised (secondary): rank {waiting}: " in console
    assert f"  rank {early}: ENDED EARLY (exit 0)" in console


@pytest.mark.parametrize(("mode", "early", "how"), [
    ((), 0, "it exited with code 0 in its task (sys.exit(0), say)"), ((), 1, "its task called sys.exit(0)"),
    (("-m",), 0, "its task called sys.exit(0)")], ids=["plain-rank-0", "plain", "multirun-rank-0"])
def test_a_rank_whose_task_calls_sys_exit_0_while_the_others_wait_for_it_is_named_as_the_cause_saying_so(
        tmp_path: Path, mode: tuple[str, ...], early: int, how: str) -> None:
    """As above, but the rank's task ends with `sys.exit(0)`: the failure said "its task returned", which it never
    did; it says how the rank ended."""
    proc = run_app(tmp_path, *mode, "behaviour=exited_early", f"fail_rank={early}")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert f"rank {early} (node 0) failed: EndedEarly: {how} while rank {1 - early} still waited for it in a " \
           "collective at main (" in console, console
    assert "its task returned" not in console, console


def test_multiprocessings_temporary_folder_in_rank_0_of_a_plain_run_is_removed_as_the_program_ends(
        tmp_path: Path) -> None:
    """Rank 0 of a plain run, the program's own process, keeps the program's TMPDIR: multiprocessing removes its folder
    as the program ends, after the job. In the job's private TMPDIR, removed with the job, that ended in a traceback."""
    proc = run_app(tmp_path, "behaviour=mp_temp_dir")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "FileNotFoundError" not in proc.stderr, proc.stderr


def test_a_rank_whose_task_failed_keeps_what_it_wrote_but_runs_no_exit_handler_that_would_hold_up_the_stop(
        tmp_path: Path) -> None:
    """The job learns of the failure as the rank ends: an exit handler that takes a minute (a tracker's upload) would
    hold up the stop of the other ranks, which comes at once after a failure."""
    proc = run_app(tmp_path, "-m", "behaviour=leave_open_then_raise", timeout=50)
    assert proc.returncode == 1
    assert "rank 1 (node 0) failed: ValueError: failed with files left open" in proc.stderr, proc.stderr
    job = job_dirs(tmp_path)[0]
    assert (job / "open_rank_1.txt").read_text() == "kept\n"
    assert not (job / "atexit_rank_1.txt").exists()


def test_a_progress_bar_of_a_rank_shown_with_its_prefix_keeps_the_prefix(tmp_path: Path) -> None:
    """With `[rank k]` before each line (console_ranks=all, jobs side by side), a line a progress bar rewrote with '\\r'
    is shown as its last state after the prefix: the '\\r's came after the prefix, so a terminal overwrote it (every
    rank's bar looked alike), and a console that is a file got every state."""
    log = tmp_path / "rank_1.log"
    log.write_bytes(b"")
    read, write = os.pipe()
    echo = ConsoleEcho({1: log}, write, {1: "[rank 1] "})
    log.write_bytes(b"".join(b"\rstep %d/3" % i for i in range(4)) + b"\nloaded\r\n\rstep 1/2\r")
    echo.stop()
    os.close(write)
    with os.fdopen(read, "rb") as shown:
        assert shown.read() == b"[rank 1] step 3/3\n[rank 1] loaded\n[rank 1] step 1/2\n"


def test_two_streams_copied_into_one_log_never_land_inside_each_others_lines(tmp_path: Path) -> None:
    """A plain run's rank 0 after its job: its stdout and stderr, each a pipe copied to the console and to rank_0.log.
    A line that one stream writes in parts (a `print` writes its text, then its newline) stays whole in the log while
    the other stream writes a line of its own in between."""
    log = tmp_path / "rank_0.log"
    consoles = [os.pipe() for _ in range(2)]
    out, err = (PipeCopy(log, console_w) for _, console_w in consoles)

    def write(copy: PipeCopy, console_r: int, data: bytes) -> None:
        os.write(copy.writer, data)
        assert os.read(console_r, len(data)) == data  # copied: the console has it

    write(out, consoles[0][0], b"printed")
    write(err, consoles[1][0], b"to stderr\n")
    write(out, consoles[0][0], b"\n")
    for copy in (out, err):
        copy.stop()
    assert log.read_text() == "to stderr\nprinted\n"
    for console_r, console_w in consoles:
        os.close(console_r)
        os.close(console_w)
