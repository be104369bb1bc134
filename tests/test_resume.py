"""Sweeps that go on from an earlier run (`hydra.launcher.resume=true`) and sweeps that stop at their
first failure (`hydra.launcher.fail_fast=true`), run as a user runs them: `tests/apps/resume_app.py`
(1-rank jobs that note each run in a shared folder) and `tests/apps/side_by_side_app.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import alive, run_app, start_app, wait_for

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes

APP = "resume_app.py"


def summary(sweep: Path) -> dict[int, dict]:
    """The jobs of the sweep's `sweep_summary.json`, by number."""
    return {job["job"]: job for job in json.loads((sweep / "sweep_summary.json").read_text())["jobs"]}


def runs(folder: Path, job: int) -> int:
    """How many times job `job` ran."""
    path = folder / f"ran_{job}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def sweep_args(tmp_path: Path, *overrides: str) -> tuple[str, ...]:
    """A 4-job sweep in `tmp_path/sw`, noting its runs in `tmp_path/runs`."""
    (tmp_path / "runs").mkdir(exist_ok=True)
    return ("-m", "x=0,1,2,3", f"runs={tmp_path / 'runs'}", *overrides, f"hydra.sweep.dir={tmp_path / 'sw'}")


def test_a_resumed_sweep_runs_only_the_job_that_failed(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "fail_once=2")
    first = run_app(tmp_path, *args, app=APP)
    assert first.returncode == 1
    assert first.stdout.index("[ddpw] job #2 FAILED") < first.stdout.index("#3 : x=3")  # reported when it fails
    sweep = tmp_path / "sw"
    assert {job: e["status"] for job, e in summary(sweep).items()} == {
        0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "COMPLETED"}
    before = {job: (sweep / str(job) / ".hydra" / "config.yaml").stat().st_mtime_ns for job in (0, 1, 3)}

    retyped = ("-m", "hydra.launcher.resume=true", *reversed(args[1:]))  # the same overrides in another order
    resumed = run_app(tmp_path, *retyped, app=APP)
    assert resumed.returncode == 0, resumed.stderr
    assert [runs(tmp_path / "runs", job) for job in range(4)] == [1, 1, 2, 1]  # only job #2 ran again
    jobs = summary(sweep)
    assert {job: (e["status"], e["kept"], e["return_value"]) for job, e in jobs.items()} == {
        0: ("COMPLETED", True, 0.5), 1: ("COMPLETED", True, 10.5), 2: ("COMPLETED", False, 20.5),
        3: ("COMPLETED", True, 30.5)}
    assert jobs[2]["output_dir"] == str(sweep / "2")  # the same job number and output dir
    assert {job: (sweep / str(job) / ".hydra" / "config.yaml").stat().st_mtime_ns for job in (0, 1, 3)} == before
    assert "4 jobs, 4 COMPLETED (3 kept)" in resumed.stdout
    kept = next(line for line in resumed.stdout.splitlines() if "#0 : " in line)
    assert "x=0" in kept and kept.endswith("(kept: COMPLETED in the earlier run)"), resumed.stdout


def test_a_resumed_sweep_whose_job_fails_again_counts_the_kept_jobs_with_the_completed_ones(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "fail_once=3")
    assert run_app(tmp_path, *args, app=APP).returncode == 1
    (tmp_path / "runs" / "failed_once").unlink()  # job #3 fails again
    resumed = run_app(tmp_path, *args, "hydra.launcher.resume=true", app=APP)
    assert resumed.returncode == 1
    assert [runs(tmp_path / "runs", job) for job in range(4)] == [1, 1, 1, 2]
    # It said "4 jobs, 3 COMPLETED, 1 FAILED (3 kept)", as if the failed job was among the kept ones.
    assert "4 jobs, 3 COMPLETED (3 kept), 1 FAILED (" in resumed.stdout, resumed.stdout


def test_a_resume_of_another_sweep_is_refused_naming_what_differs(tmp_path: Path) -> None:
    first = run_app(tmp_path, *sweep_args(tmp_path), app=APP)
    assert first.returncode == 0, first.stderr
    args = ("-m", "x=0,1,2", f"runs={tmp_path / 'runs'}", f"hydra.sweep.dir={tmp_path / 'sw'}",
            "hydra.launcher.resume=true")
    other = run_app(tmp_path, *args, app=APP)
    assert other.returncode == 1
    assert "hydra.launcher.resume=True: this sweep differs from the earlier run" in other.stderr
    assert "x=0,1,2 (earlier: x=0,1,2,3)" in other.stderr
    assert "sweep summary" not in other.stdout  # the earlier run's summary is not shown as this one's
    assert [runs(tmp_path / "runs", job) for job in range(4)] == [1, 1, 1, 1]
    elsewhere = run_app(tmp_path, *sweep_args(tmp_path), "hydra.sweep.dir=nowhere", "hydra.launcher.resume=true",
                        app=APP)
    assert elsewhere.returncode == 1 and "hydra.sweep.dir=nowhere holds no earlier run of a sweep" in elsewhere.stderr
    assert not (tmp_path / "nowhere").exists()  # the refused sweep leaves no dir behind (it left one with its lock)
    assert (tmp_path / "sw" / "multirun.yaml").exists()  # the refused resume leaves the earlier run's as it was


def test_a_sweep_killed_while_its_second_job_runs_resumes_keeping_the_first(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "hold=1")
    folder, sweep = tmp_path / "runs", tmp_path / "sw"
    (folder / "hold").touch()  # job #1 holds until it is gone
    proc = start_app(tmp_path, *args, app=APP)
    wait_for(lambda: (folder / "holding_1").exists(), timeout=60, what="job #1 to run")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    rank = int((folder / "holding_1").read_text())
    wait_for(lambda: not alive(rank), timeout=30, what="the killed sweep's rank to exit")
    assert {job: e["status"] for job, e in summary(sweep).items()} == {0: "COMPLETED", 1: "RUNNING"}

    (folder / "hold").unlink()
    resumed = run_app(tmp_path, *args, "hydra.launcher.resume=true", app=APP)
    assert resumed.returncode == 0, resumed.stderr
    assert [runs(folder, job) for job in range(4)] == [1, 2, 1, 1]
    jobs = summary(sweep)
    assert {job: (e["status"], e["kept"]) for job, e in jobs.items()} == {
        0: ("COMPLETED", True), 1: ("COMPLETED", False), 2: ("COMPLETED", False), 3: ("COMPLETED", False)}
    assert [e["return_value"] for e in jobs.values()] == [0.5, 10.5, 20.5, 30.5]
    assert {line.split()[1] for line in (folder / "ran_1").read_text().splitlines()} == {str(sweep / "1")}


def test_a_job_stopped_after_a_restart_counts_its_restart_in_the_summary(tmp_path: Path) -> None:
    # Job #1 fails once, starts again (max_restarts=1) and holds there until SIGTERM stops the sweep.
    args = sweep_args(tmp_path, "fail_once=1", "hold=1", "hydra.launcher.max_restarts=1")
    folder = tmp_path / "runs"
    (folder / "hold").touch()
    proc = start_app(tmp_path, *args, app=APP)
    wait_for(lambda: (folder / "holding_1").exists(), timeout=60, what="job #1's second attempt to run")
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert runs(folder, 1) == 2  # it had started again before it was stopped
    jobs = summary(tmp_path / "sw")
    assert {job: (e["status"], e["restarts"]) for job, e in jobs.items()} == {
        0: ("COMPLETED", 0), 1: ("TERMINATED", 1), 2: ("NOT STARTED", 0), 3: ("NOT STARTED", 0)}
    assert "#1   TERMINATED (1 restart)" in stdout, stdout


def test_a_sweep_in_a_dir_where_one_runs_now_is_refused_a_resume_beside_it_or_a_new_one(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "hold=1")
    folder = tmp_path / "runs"
    (folder / "hold").touch()
    proc = start_app(tmp_path, *args, app=APP)
    wait_for(lambda: (folder / "holding_1").exists(), timeout=60, what="job #1 to run")
    for also in (("hydra.launcher.resume=true",), ()):
        beside = run_app(tmp_path, *args, *also, app=APP)
        assert beside.returncode == 1
        assert f"hydra.sweep.dir='{tmp_path / 'sw'}': a sweep runs in this dir now (process {proc.pid})" \
            in beside.stderr, beside.stderr
    assert [runs(folder, job) for job in range(4)] == [1, 1, 0, 0]  # neither ran a job
    (folder / "hold").unlink()
    assert proc.wait(timeout=60) == 0
    after = run_app(tmp_path, *args, "hydra.launcher.resume=true", app=APP)  # the dir is free once it ended
    assert after.returncode == 0, after.stderr
    assert "4 jobs, 4 COMPLETED (4 kept)" in after.stdout and [runs(folder, job) for job in range(4)] == [1] * 4


def test_a_sweep_dir_moved_since_resumes_there_and_one_named_by_another_config_is_refused(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "fail_once=2")
    assert run_app(tmp_path, *args, app=APP).returncode == 1
    (tmp_path / "sw").rename(tmp_path / "moved")
    resumed = run_app(tmp_path, *args, f"hydra.sweep.dir={tmp_path / 'moved'}", "hydra.launcher.resume=true", app=APP)
    assert resumed.returncode == 0, resumed.stderr
    assert not (tmp_path / "sw").exists()  # nothing ran where the sweep was
    assert {e["output_dir"] for e in summary(tmp_path / "moved").values()} == {
        str(tmp_path / "moved" / str(job)) for job in range(4)}
    assert (tmp_path / "runs" / "ran_2").read_text().splitlines()[-1].endswith(str(tmp_path / "moved" / "2"))
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "other.yaml").write_text("defaults:\n  - resume\n  - _self_\n")
    other = run_app(tmp_path, "--config-dir", str(tmp_path / "more"), "--config-name", "other", *args,
                    f"hydra.sweep.dir={tmp_path / 'moved'}", "hydra.launcher.resume=true", app=APP)
    assert other.returncode == 1 and "--config-name other (earlier: resume)" in other.stderr, other.stderr


def fail_fast_sweep(tmp_path: Path, jobs: str, behaviour: str) -> subprocess.CompletedProcess[str]:
    """A sweep of `jobs` with `fail_fast`, two side by side, where job #1 fails once both started, run in `tmp_path/sw`
    (they meet in `tmp_path/meet`); each other job does as `behaviour` says (`tests/apps/side_by_side_app.py`)."""
    meet = tmp_path / "meet"
    meet.mkdir()
    proc = run_app(tmp_path, "-m", f"job={jobs}", "together=2", "fail_job=1", f"behaviour={behaviour}", f"meet={meet}",
                   "hydra.sweep.dir=sw", "hydra.launcher.max_parallel_jobs=2", "hydra.launcher.fail_fast=true",
                   app="side_by_side_app.py", timeout=90)
    assert proc.returncode == 1
    assert "ValueError: job 1 asked to fail" in proc.stderr
    return proc


def test_fail_fast_stops_the_jobs_beside_the_failed_one_and_starts_no_more(tmp_path: Path) -> None:
    proc = fail_fast_sweep(tmp_path, "0,1,2", "block")  # job #0 would block for ever
    assert "[ddpw] job #1 failed (hydra.launcher.fail_fast=true): stopping job(s) #0; not starting job(s) #2" \
        in proc.stderr
    assert {job: e["status"] for job, e in summary(tmp_path / "sw").items()} == {
        0: "STOPPED", 1: "FAILED", 2: "NOT STARTED"}
    assert not (tmp_path / "meet" / "started_2").exists()


def test_fail_fast_keeps_the_value_of_a_job_beside_it_whose_task_had_returned(tmp_path: Path) -> None:
    # Job #0's task returns, then its rank waits in an atexit handler (a tracker's upload) as job #1 fails.
    fail_fast_sweep(tmp_path, "0,1", "linger")
    jobs = summary(tmp_path / "sw")
    assert {job: e["status"] for job, e in jobs.items()} == {0: "COMPLETED", 1: "FAILED"}
    assert jobs[0]["return_value"]["job"] == 0  # kept by a resume, which runs only job #1 again


def test_a_sweeper_that_chooses_its_jobs_as_it_goes_refuses_resume(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "hydra.launcher.resume=true", app="sweep_app.py")  # Optuna
    assert proc.returncode == 1
    assert "chooses its jobs as it goes" in proc.stderr and "hydra.sweeper.storage" in proc.stderr
    assert not list(tmp_path.rglob(".hydra"))


def test_jobs_that_return_nan_or_inf_leave_a_summary_any_json_reader_takes_and_a_resume_keeps_them(
    tmp_path: Path
) -> None:
    def not_json(constant: str) -> None:
        raise AssertionError(f"{constant} is no JSON value")

    args = ("-m", "x=nan,inf,-inf", *sweep_args(tmp_path)[2:])
    first = run_app(tmp_path, *args, app=APP)
    assert first.returncode == 0, first.stderr
    jobs = json.loads((tmp_path / "sw" / "sweep_summary.json").read_text(), parse_constant=not_json)["jobs"]
    assert [e["return_value"] for e in jobs] == ["nan", "inf", "-inf"]
    resumed = run_app(tmp_path, *args, "hydra.launcher.resume=true", app=APP)
    assert resumed.returncode == 0, resumed.stderr
    assert [runs(tmp_path / "runs", job) for job in range(3)] == [1, 1, 1]
    assert [e["kept"] for e in summary(tmp_path / "sw").values()] == [True, True, True]


def test_a_sweep_that_did_not_end_names_its_resume_and_a_resume_in_a_new_dir_names_the_earlier_run(
    tmp_path: Path
) -> None:
    # A sweep killed in Hydra's default `multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}`, resumed with the same command and
    # resume=true, looks in a new dir of that day (or the next): it said only "holds no earlier run of a sweep".
    (tmp_path / "runs").mkdir()
    args = ("-m", "x=0,1", "fail_once=1", f"runs={tmp_path / 'runs'}")
    first = run_app(tmp_path, *args, "hydra.sweep.dir=multirun/day1/10-00-00", app=APP)
    assert first.returncode == 1
    hint = next(line for line in first.stdout.splitlines() if line.startswith("  resume: "))
    assert hint == ("  resume: the same command with hydra.launcher.resume=true hydra.sweep.dir=multirun/day1/10-00-00 "
                    "runs the jobs not COMPLETED (in their dirs) and keeps the others")
    other = run_app(tmp_path, "-m", "x=0,1", f"runs={tmp_path / 'runs'}", "hydra.sweep.dir=multirun/day1/10-05-00",
                    app=APP)  # another sweep, newer, that COMPLETED: no resume line
    assert other.returncode == 0 and "resume: " not in other.stdout, other.stdout

    resumed = run_app(tmp_path, *args, "hydra.launcher.resume=true", "hydra.sweep.dir=multirun/day2/09-00-00", app=APP)
    assert resumed.returncode == 1
    assert ("hydra.sweep.dir=multirun/day2/09-00-00 holds no earlier run of a sweep (no multirun/day2/09-00-00/"
            "sweep_summary.json with its record): the newest earlier run of this sweep is in multirun/day1/10-00-00: "
            "add hydra.sweep.dir=multirun/day1/10-00-00 to go on with it, or run without resume") in resumed.stderr
    assert not (tmp_path / "multirun" / "day2").exists()
    assert [runs(tmp_path / "runs", job) for job in range(2)] == [2, 2]  # (one run of each sweep)

    named = run_app(tmp_path, *args, "hydra.launcher.resume=true", "hydra.sweep.dir=multirun/day1/10-00-00", app=APP)
    assert named.returncode == 0, named.stderr
    assert [runs(tmp_path / "runs", job) for job in range(2)] == [2, 3]
    assert "2 jobs, 2 COMPLETED (1 kept)" in named.stdout and "resume: " not in named.stdout


def test_a_sweep_run_again_without_resume_in_its_dir_says_it_runs_the_completed_jobs_again(tmp_path: Path) -> None:
    args = ("-m", "x=0,1", "fail_once=1", f"runs={tmp_path / 'runs'}", "hydra.sweep.dir=sw")
    (tmp_path / "runs").mkdir()
    assert run_app(tmp_path, *args, app=APP).returncode == 1
    again = run_app(tmp_path, *args, app=APP)  # resume=true forgotten: job #0 ran again, without a word
    assert again.returncode == 0, again.stderr
    assert [runs(tmp_path / "runs", job) for job in range(2)] == [2, 2]
    assert ("hydra.sweep.dir=sw holds an earlier run of this sweep, 1 of its jobs COMPLETED: this sweep runs them "
            "again, in the same dirs; to keep them, stop it (Ctrl-C) and run it with hydra.launcher.resume=true") \
        in again.stdout + again.stderr
    other = run_app(tmp_path, "-m", "x=0,1", f"runs={tmp_path / 'runs'}", "hydra.sweep.dir=sw", app=APP)
    assert other.returncode == 0 and "holds an earlier run" not in other.stdout + other.stderr  # another sweep
