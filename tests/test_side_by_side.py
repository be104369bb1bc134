"""Jobs of a sweep side by side (`hydra.launcher.max_parallel_jobs`), and the sweep summary.

CPU packing runs real sweeps of one-rank jobs that each take one core (`platform.n_cpus_per_node=1`):
the jobs meet in a shared folder, so "two jobs ran at once" is shown by each job having seen the other
start, and "never at once" by each having seen the ones before it end, not by timing. GPU packing cannot
run here: its tests give `Devices` a mocked list of GPUs.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from ddpw_conf import Platform
from ddpw_runtime.hydra_jobs.prepare import PreparedJob
from ddpw_runtime.launch.devices import Devices, Need, Share, visible_gpus
from ddpw_runtime.launch.plan import plan_local
from ddpw_runtime.procs.sweep import Schedule
from ddpw_runtime.rank.environment import rank_environment
from tests.helpers import alive, run_app, start_app

APP = "side_by_side_app.py"


def sweep(tmp_path: Path, *overrides: str, timeout: float = 120) -> tuple[Any, dict[int, dict]]:
    """Run a sweep of the meeting app; its process and what each job said when it started."""
    meet = tmp_path / "meet"
    meet.mkdir()
    proc = run_app(tmp_path, "-m", f"meet={meet}", "hydra.sweep.dir=sw", *overrides, app=APP, timeout=timeout)
    started = {int(p.name.split("_")[1]): json.loads(p.read_text()) for p in meet.glob("started_*")}
    return proc, started


def free_port() -> int:
    """A port no program listens on now."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def summary_of(tmp_path: Path) -> list[dict]:
    """The jobs of `sw/sweep_summary.json`."""
    jobs: list[dict] = json.loads((tmp_path / "sw" / "sweep_summary.json").read_text())["jobs"]
    return jobs


@pytest.mark.subprocess
def test_cpu_jobs_run_side_by_side_each_on_a_core_of_its_own(tmp_path: Path) -> None:
    proc, started = sweep(tmp_path, "job=0,1", "together=2")  # each job waits until both have started
    assert proc.returncode == 0, proc.stderr
    assert sorted(started) == [0, 1]
    assert started[0]["cores"] != started[1]["cores"] and all(len(s["cores"]) == 1 for s in started.values())
    assert {s["threads"] for s in started.values()} == {"1"}
    jobs = summary_of(tmp_path)
    assert [(j["job"], j["status"], j["return_value"]["job"]) for j in jobs] == [
        (0, "COMPLETED", 0), (1, "COMPLETED", 1)]
    for job in (0, 1):  # console lines told apart; each job's log holds its own lines only
        assert f"[job {job}] job {job} prints" in proc.stdout
        log = (tmp_path / "sw" / str(job) / "side_by_side_app.log").read_text()
        assert f"job {job} logs to its own log" in log and f"job {1 - job} logs" not in log
        assert (tmp_path / "sw" / str(job) / ".hydra" / "overrides.yaml").read_text().count(f"job={job}") == 1
    table = proc.stdout[proc.stdout.index("[ddpw] sweep summary: 2 jobs, 2 COMPLETED (sw/sweep_summary.json)"):]
    assert [line.split()[:2] for line in table.splitlines()[2:4]] == [["#0", "COMPLETED"], ["#1", "COMPLETED"]]


@pytest.mark.subprocess
def test_a_failing_job_does_not_stop_the_jobs_beside_it(tmp_path: Path) -> None:
    # job 1 fails once both have started; jobs 0 and 2 run on (2 starts when 1's core is free)
    proc, started = sweep(tmp_path, "job=0,1,2", "together=2", "fail_job=1")
    assert proc.returncode == 1
    assert sorted(started) == [0, 1, 2]
    jobs = summary_of(tmp_path)
    assert [(j["job"], j["status"]) for j in jobs] == [(0, "COMPLETED"), (1, "FAILED"), (2, "COMPLETED")]
    assert jobs[1]["error"] == "rank 0 failed: ValueError: job 1 asked to fail" and jobs[1]["return_value"] is None
    assert "[ddpw] sweep summary: 3 jobs, 2 COMPLETED, 1 FAILED" in proc.stdout  # printed though Hydra raised


@pytest.mark.subprocess
def test_jobs_side_by_side_keep_every_line_of_their_logs_whatever_the_handlers_do(tmp_path: Path) -> None:
    # A job log opened with mode `w` and a callback that logs when each job starts and ends: jobs side by
    # side each have a process of their own, so nothing of one job's logging touches another's.
    proc, started = sweep(tmp_path, "job=0,1,2,3", "together=2", "+hydra.job_logging.handlers.file.mode=w",
                          "+hydra.callbacks.events._target_=job_events.LogsJobEvents")
    assert proc.returncode == 0, proc.stderr
    assert sorted(started) == [0, 1, 2, 3]
    assert len({s["pid"] for s in started.values()}) == 4
    for job in range(4):
        log = (tmp_path / "sw" / str(job) / "side_by_side_app.log").read_text()
        assert "\0" not in log
        for line in (f"on_job_start of job {job}", f"job {job} logs to its own log", f"on_job_end of job {job}"):
            assert log.count(line) == 1, (job, line, log)
        assert all(f"of job {other}" not in log for other in range(4) if other != job)


@pytest.mark.subprocess
def test_ctrl_c_stops_every_job_running_side_by_side(tmp_path: Path) -> None:
    meet = tmp_path / "meet"
    meet.mkdir()
    # two jobs fill both cores; the third waits for a core, and never starts
    proc = start_app(tmp_path, "-m", f"meet={meet}", "hydra.sweep.dir=sw", "job=0,1,2", "together=2",
                     "behaviour=block", app=APP)
    try:
        while len(list(meet.glob("started_*"))) < 2 and proc.poll() is None:
            threading.Event().wait(0.05)
        assert proc.poll() is None, proc.communicate()
        pids = [json.loads(p.read_text())["pid"] for p in meet.glob("started_*")]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.count("Interrupted: every rank of job #0 was stopped.") == 1
    assert err.count("Interrupted: every rank of job #1 was stopped.") == 1
    assert "Traceback" not in err and "ddpw_runtime" not in err and "job #2" not in err, err
    assert not [pid for pid in pids if alive(pid)]
    assert [(j["job"], j["status"]) for j in summary_of(tmp_path)] == [
        (0, "INTERRUPTED"), (1, "INTERRUPTED"), (2, "NOT STARTED")]
    assert "[ddpw] sweep summary: 3 jobs, 2 INTERRUPTED, 1 NOT STARTED" in out


@pytest.mark.subprocess
def test_max_parallel_jobs_1_and_jobs_that_take_the_whole_machine_run_one_after_another(tmp_path: Path) -> None:
    for name, override in (("limit", "hydra.launcher.max_parallel_jobs=1"), ("whole", "platform.n_cpus_per_node=null")):
        (tmp_path / name).mkdir()
        proc, started = sweep(tmp_path / name, "job=0,1", override)
        assert proc.returncode == 0, proc.stderr
        jobs = summary_of(tmp_path / name)
        assert jobs[0]["return_value"]["ended"] <= jobs[1]["return_value"]["started"], name
        assert "[job 0]" not in proc.stdout


@pytest.mark.subprocess
def test_jobs_that_set_the_same_master_port_run_one_after_another_in_job_order(tmp_path: Path) -> None:
    # three one-core jobs would run side by side on any two cores, but each must listen on the port alone
    port = free_port()
    proc, started = sweep(tmp_path, "job=0,1,2", f"platform.master_port={port}")
    assert proc.returncode == 0, proc.stderr
    assert [(job, seen["ended_before"], seen["running_beside"]) for job, seen in sorted(started.items())] == [
        (0, [], []), (1, [0], []), (2, [0, 1], [])]
    assert [(j["job"], j["status"]) for j in summary_of(tmp_path)] == [(0, "COMPLETED"), (1, "COMPLETED"),
                                                                     (2, "COMPLETED")]
    assert (f"jobs #0, #1, #2 set the same platform.master_port={port}: they run one after another"
            in proc.stdout + proc.stderr)
    assert "another program" not in proc.stdout + proc.stderr


@pytest.mark.subprocess
def test_a_port_another_program_listens_on_refuses_the_sweep_before_any_job_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other_program:
        port = other_program.getsockname()[1]
        proc, started = sweep(tmp_path, "job=0,1,2", f"platform.master_port={port}")
    assert proc.returncode == 1 and started == {}
    assert (f"platform.master_port={port}: another program is listening on this port; choose a free port or "
            "leave master_port unset (null)") in proc.stderr
    assert not any(tmp_path.rglob("rank_*.log"))


@pytest.mark.subprocess
def test_a_job_asking_for_more_cores_than_the_machine_has_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc, started = sweep(tmp_path, "job=0,1", "platform.n_cpus_per_node=4096")
    assert proc.returncode == 1 and started == {}
    assert "platform.n_cpus_per_node" in proc.stderr and "4096" in proc.stderr and "ask for at most" in proc.stderr


# ---------------------------------------------------------------- GPU packing, with a mocked GPU list


def gpu_job(idx: int, gpus: int) -> PreparedJob:
    """A job of `gpus` GPUs (nothing runs it: the schedule alone is tested)."""
    return PreparedJob(idx, [f"job={idx}"], OmegaConf.create({}), Platform(device="gpu", n_gpus_per_node=gpus),
                       Path(f"/nonexistent/{idx}"))


def started_at_once(schedule: Schedule) -> list[tuple[PreparedJob, Share | None]]:
    """Every job the schedule starts now."""
    started = []
    while (ready := schedule.next()) is not None:
        started.append(ready)
    return started


def test_gpu_jobs_get_disjoint_gpus_and_start_as_gpus_free_up_mocked_gpus() -> None:
    jobs = [gpu_job(0, 2), gpu_job(1, 2), gpu_job(2, 2)]  # 4 GPUs: two jobs at a time
    schedule = Schedule(list(jobs), Devices(("0", "1", "2", "3"), (0, 1)), None)
    first = started_at_once(schedule)
    assert [job.idx for job, _ in first] == [0, 1]
    shares = {job.idx: share for job, share in first}
    assert {s.gpus for s in shares.values() if s is not None} == {("0", "1"), ("2", "3")}
    # GPU jobs share the cores; their threads count on their part of them (2 GPUs of 4: half of 2 cores)
    assert {(s.cpus, s.n_cpus) for s in shares.values() if s is not None} == {(None, 1)}
    freed = shares[1]
    assert freed is not None
    schedule.ended(freed)
    ((third, share),) = started_at_once(schedule)
    assert third.idx == 2 and share is not None and share.gpus == freed.gpus  # the GPUs job 1 freed


def test_max_parallel_jobs_caps_jobs_that_would_fit_mocked_gpus() -> None:
    jobs = [gpu_job(idx, 1) for idx in range(6)]
    assert len(started_at_once(Schedule(list(jobs), Devices(tuple("01234567"), (0,)), 3))) == 3
    every = started_at_once(Schedule(list(jobs), Devices(tuple("01234567"), (0,)), None))
    assert len(every) == 6 and len({share.gpus for _, share in every if share is not None}) == 6


def test_a_job_waits_for_the_fixed_port_a_job_beside_it_holds_and_keeps_its_place() -> None:
    jobs = [PreparedJob(idx, [f"job={idx}"], OmegaConf.create({}),
                        Platform(device="cpu", n_cpus_per_node=1, master_port=port), Path(f"/nonexistent/{idx}"))
            for idx, port in enumerate((29400, 29400, None, 29401))]
    schedule = Schedule(list(jobs), Devices((), (0, 1, 2, 3)), None)
    ((first, share),) = started_at_once(schedule)  # job 1 waits for the port; job 2 does not overtake it
    assert first.idx == 0 and share is not None and share.port == 29400
    schedule.ended(share)
    assert [(job.idx, share.port if share else None) for job, share in started_at_once(schedule)] == [
        (1, 29400), (2, None), (3, 29401)]


def test_jobs_one_after_another_start_one_at_a_time_in_order() -> None:
    jobs = [gpu_job(idx, 1) for idx in range(2)]
    schedule = Schedule(list(jobs), None, 1)
    ((first, share),) = started_at_once(schedule)
    assert first.idx == 0 and share is None
    schedule.ended(share)
    assert [job.idx for job, _ in started_at_once(schedule)] == [1]


def test_a_rank_of_a_job_beside_others_sees_only_its_jobs_gpus_mocked_gpus(tmp_path: Path) -> None:
    platform = Platform(device="gpu", n_gpus_per_node=2, n_procs_per_node=2)
    plan = plan_local(platform, tmp_path, tmp_path, "run", share=Share(gpus=("5", "7"), n_cpus=8))
    assert rank_environment(plan, 1, 1, {})["CUDA_VISIBLE_DEVICES"] == "5,7"  # rank 1 binds cuda:1, GPU 7
    assert plan.threads_per_rank == 4
    alone = plan_local(platform, tmp_path, tmp_path, "run")
    assert "CUDA_VISIBLE_DEVICES" not in rank_environment(alone, 1, 1, {})


def test_gpu_names_follow_the_callers_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus(2) == ("3", "5")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus(3) == ("0", "1", "2")


def test_what_a_job_takes_from_the_machine() -> None:
    assert Need.of(Platform(device="gpu", n_gpus_per_node=2)) == Need(gpus=2)
    assert Need.of(Platform(device="gpu", n_gpus_per_node=1, n_cpus_per_node=4)) == Need(gpus=1, cpus=4)
    assert Need.of(Platform(device="cpu", n_cpus_per_node=2)) == Need(cpus=2)
    assert Need.of(Platform(device="cpu")).whole and Need.of(Platform(device="mps")).whole
    assert Need.of(Platform(device="cpu", n_cpus_per_node=1, master_port=29400)) == Need(cpus=1, port=29400)
    assert Need.of(Platform(device="cpu", n_cpus_per_node=1, master_port=29400, ipc_protocol="file")).port is None
    devices = Devices(("0",), (0, 1, 2))
    whole = devices.take(Need(whole=True))
    assert whole is not None and devices.take(Need(cpus=1)) is None  # nothing beside a whole-machine job
    devices.give_back(whole)
    part = devices.take(Need(cpus=2))
    assert part == Share(cpus=(0, 1), n_cpus=2) and devices.take(Need(whole=True)) is None
    assert devices.take(Need(gpus=1)) == Share(gpus=("0",), n_cpus=3)  # one GPU of one: every core counted
    assert devices.take(Need(cpus=2)) is None and devices.take(Need(cpus=1)) == Share(cpus=(2,), n_cpus=1)


@pytest.mark.subprocess
def test_a_sweepers_batch_runs_side_by_side(tmp_path: Path) -> None:
    # Hydra's basic sweeper hands the launcher batches of 2; both jobs of a batch must run at once
    proc, started = sweep(tmp_path, "job=0,1,2,3", "together=2", "hydra.sweeper.max_batch_size=2")
    assert proc.returncode == 0, proc.stderr
    assert sorted(started) == [0, 1, 2, 3]
    assert [j["job"] for j in summary_of(tmp_path)] == [0, 1, 2, 3]  # one summary across batches
