"""Faults the launcher survives: hangs, signals to the controller, a busy port, floods of output,
many ranks and many jobs. Real processes throughout; each test checks nothing is left running."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from ddpw_conf import Platform
from tests.helpers import alive, job_dirs, leftover, open_fds, run_app, run_ranks, seen, start_app, wait_for

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def _started(tmp_path: Path, proc: subprocess.Popen, ranks: int = 2) -> dict:
    """Wait until every rank of the (single) job is inside the task; what they reported."""
    wait_for(lambda: job_dirs(tmp_path) and len(seen(job_dirs(tmp_path)[0])) == ranks or proc.poll() is not None,
             what="the ranks to start")
    assert proc.poll() is None, proc.communicate()
    return seen(job_dirs(tmp_path)[0])


def test_a_hung_rank_is_stopped_at_the_time_limit_showing_where_each_rank_was(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hang", "platform.timeout_min=0.05")
    assert proc.returncode != 0
    assert "ran past its time limit (platform.timeout_min=0.05)" in proc.stderr
    assert "rank 1: misbehave (" in proc.stderr  # the hung rank, in its sleep loop
    assert "rank 0: barrier (" in proc.stderr  # the rank waiting for it
    job = job_dirs(tmp_path)[0]
    assert "most recent call first" in (job / "rank_1.log").read_text()
    assert leftover(seen(job)) == []


def test_a_stalled_collective_fails_after_the_collective_timeout(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hang", "platform.collective_timeout_min=0.05")
    assert proc.returncode == 1
    assert "rank 0 failed: " in proc.stdout  # the job's summary; rank 0 is this process in a plain run
    assert "dist.barrier()" in proc.stderr and "Timed out" in proc.stderr  # its traceback, as Hydra shows it
    job = job_dirs(tmp_path)[0]
    assert "most recent call first" in (job / "rank_1.log").read_text()  # where the other rank was
    assert leftover(seen(job)) == []


def test_ctrl_c_passes_to_the_ranks_then_exits_130(tmp_path: Path) -> None:
    proc = start_app(tmp_path, "behaviour=wait")
    ranks = _started(tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Interrupted: every rank of job #0 was stopped." in stderr
    job = job_dirs(tmp_path)[0]
    assert all("KeyboardInterrupt" in (job / f"rank_{r}.log").read_text() for r in (0, 1))
    assert leftover(ranks) == []


def test_sigterm_gives_ranks_time_to_save_then_exits_143(tmp_path: Path) -> None:
    proc = start_app(tmp_path, "behaviour=wait")
    ranks = _started(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    job = job_dirs(tmp_path)[0]
    assert sorted(p.name for p in job.glob("saved_rank_*.txt")) == ["saved_rank_0.txt", "saved_rank_1.txt"]
    assert leftover(ranks) == []


def test_ranks_exit_when_the_controller_is_killed(tmp_path: Path) -> None:
    proc = start_app(tmp_path, "behaviour=wait")
    ranks = _started(tmp_path, proc)
    proc.kill()
    proc.communicate(timeout=60)
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="the ranks to exit after their controller died")


def test_a_busy_fixed_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        port = other_program.getsockname()[1]
        proc = run_app(tmp_path, f"platform.master_port={port}")
    assert proc.returncode != 0
    assert f"platform.master_port={port}: another program is listening on this port" in proc.stderr
    assert not any(tmp_path.rglob("rank_*.log"))


def test_the_rendezvous_store_listens_on_loopback_only(tmp_path: Path) -> None:
    def listening_addresses() -> list:
        import os

        port = int(os.environ["MASTER_PORT"])
        found = []
        tables = [Path(f"/proc/net/{name}").read_text().splitlines()[1:] for name in ("tcp", "tcp6")]
        for line in tables[0] + tables[1]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.append(local.rsplit(":", 1)[0])
        return found

    values = run_ranks(listening_addresses, platform=Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path)
    assert values[0] == ["0100007F"]  # 127.0.0.1, and nothing on any other address


def test_a_flood_of_output_is_kept_whole_and_the_traceback_still_shown(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=flood", "platform.console_ranks=all")
    assert proc.returncode != 0
    assert "RuntimeError: failed after a flood of output" in proc.stderr
    log = job_dirs(tmp_path)[0] / "rank_1.log"
    assert log.read_text().count("x" * 1023 + "\n") == 50 * 1024
    assert proc.stdout.count("x" * 1023) == 50 * 1024  # echoed whole on the console too


def test_many_jobs_and_many_ranks_leak_no_fd_and_no_process(tmp_path: Path) -> None:
    def pid() -> int:
        import os

        return os.getpid()

    run_ranks(pid, platform=Platform(verbose=False), log_dir=tmp_path)  # the starter exists before counting
    before = open_fds()
    pids = []
    for _ in range(30):
        pids += run_ranks(pid, platform=Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path)
    pids += run_ranks(pid, platform=Platform(n_procs_per_node=16, verbose=False), log_dir=tmp_path)
    assert open_fds() == before
    assert len(set(pids)) == 76 and not any(alive(p) for p in pids)


def test_a_failed_job_leaves_nothing_that_breaks_the_next(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "behaviour=raise,ok,kill,ok")
    assert proc.returncode != 0
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 4
    assert all(sorted(seen(job)) == [0, 1] for job in jobs)  # every job ran, failures did not leak


class _FailsToArrive:
    """An argument that cannot be rebuilt in a rank: the rank fails before its process group exists."""

    def __reduce__(self) -> tuple:
        return (_refuse, ())


def _refuse() -> None:
    raise RuntimeError("argument could not be rebuilt in the rank")


def test_a_rank_failing_before_the_process_group_exists_is_reported(tmp_path: Path) -> None:
    import pytest

    from ddpw_runtime import RankFailure

    with pytest.raises(RankFailure) as info:
        run_ranks(print, _FailsToArrive(), platform=Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path)
    assert "argument could not be rebuilt in the rank" in str(info.value)
    assert info.value.rank in (0, 1)
