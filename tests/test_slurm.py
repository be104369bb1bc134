"""`hydra/launcher=ddpw_slurm` on a real SLURM cluster started for the session (two nodes n1, n2;
partitions debug and cpu2; see tests/slurm/cluster.sh), run as a user runs it:
`python tests/apps/slurm_app.py [-m] ...` with the cluster's SLURM_CONF in the environment.

Tests that need the cluster take the `slurm_env` fixture and are skipped, with the reason and how to
enable them, where it cannot be started. The dry run, the checks of what may reach the sbatch script
and the result logic need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobReturn, JobStatus

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import SlurmLauncherConf
from ddpw_runtime.errors import RankFailure, SlurmJobError
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RaisedError, RankResult
from ddpw_runtime.slurm.outcomes import NodeOutcome, job_return
from ddpw_runtime.slurm.sbatch import sbatch_parameters
from tests.helpers import APPS, job_dirs, leftover, run_app, seen, start_app, wait_for


def _gone(ranks: dict) -> None:
    """The ranks and their starters exit once the job is over; SLURM reports the job done a moment
    before the node's processes have all exited, so this waits (10 s at most) rather than asserts."""
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="the job's processes to exit")

APP = "slurm_app.py"
MANIFEST = "ddpw_slurm_jobs.json"


def run(cwd: Path, *overrides: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The SLURM test app, run to its end as a multirun (how jobs are submitted to SLURM)."""
    return run_app(cwd, *multirun(*overrides), app=APP, timeout=timeout)


def multirun(*overrides: str) -> tuple[str, ...]:
    """`overrides` with `-m`; a `hydra.run.dir=X` (one job) becomes the job's own dir X (the sweep dir, no subdir)."""
    out = [f"hydra.sweep.dir={o.split('=', 1)[1]}" if o.startswith("hydra.run.dir=") else o for o in overrides]
    if any(o.startswith("hydra.run.dir=") for o in overrides):
        out.append("hydra.sweep.subdir=.")
    return tuple(out) if "-m" in out else ("-m", *out)


def manifest(output_dir: Path) -> list[dict[str, Any]]:
    """The jobs the launcher recorded as submitted in `output_dir` (a run dir or a sweep dir)."""
    return json.loads((output_dir / MANIFEST).read_text())["jobs"]


def slurm(*command: str) -> str:
    """Run a SLURM client against the test cluster (never without its SLURM_CONF: a client without it
    looks for the controller in DNS)."""
    assert os.environ.get("SLURM_CONF"), "SLURM clients need the test cluster's SLURM_CONF"
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout


def seen_files(job: Path, prefix: str) -> dict[int, dict]:
    """`<prefix>_rank_<k>.json` of a job dir, by rank."""
    return {int(p.stem.rsplit("_", 1)[1]): json.loads(p.read_text()) for p in job.glob(f"{prefix}_rank_*.json")}


@pytest.mark.subprocess
# ----------------------------------------------------------------------------- on the cluster
def test_one_node_two_ranks(slurm_env: dict[str, str], tmp_path: Path) -> None:
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert job.relative_to(tmp_path).parts[0] == "multirun"  # where a multirun puts it
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    (submitted,) = manifest(job.parent)  # in the sweep dir
    for data in ranks.values():
        assert data["world_size"] == 2 and data["rank_sum"] == 1.0 and data["node_rank"] == 0
        assert data["output_dir"] == str(job)  # HydraConfig works in every rank
        assert data["env"]["SLURM_JOB_ID"] == submitted["slurm_job_id"] == data["run_id"]
        assert data["env"]["MASTER_ADDR"] == "127.0.0.1"  # one node: loopback
        assert data["threads"] == 1  # one CPU per rank asked for, and used
        assert data["restart_count"] == 0
    assert (job / ".hydra" / "config.yaml").exists()
    assert {p.name for p in job.glob("rank_*.log")} == {"rank_0.log", "rank_1.log"}
    assert "hello from rank 0" in proc.stdout  # rank 0's output, echoed while the job runs
    assert "hello from rank 1" not in proc.stdout + proc.stderr
    _gone(ranks)


@pytest.mark.subprocess
def test_two_nodes_one_rank_each_all_reduce_across_nodes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    proc = run(tmp_path, "platform.n_nodes=2", "platform.n_procs_per_node=1")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)  # node 0 alone writes .hydra/
    ranks = seen(job)
    assert {r: d["env"]["SLURM_NODEID"] for r, d in ranks.items()} == {0: "0", 1: "1"}
    assert {r: d["node_rank"] for r, d in ranks.items()} == {0: 0, 1: 1}
    assert {d["rank_sum"] for d in ranks.values()} == {1.0}  # gloo all_reduce across the two nodes
    job_id = int(ranks[0]["env"]["SLURM_JOB_ID"])
    for data in ranks.values():
        assert data["env"]["MASTER_ADDR"] == "n1"  # the first node of the allocation
        assert data["env"]["MASTER_PORT"] == str(20000 + job_id % 20000)
        assert data["output_dir"] == str(job)
    _gone(ranks)


@pytest.mark.subprocess
def test_a_repo_in_torchvision_references_style_on_one_node_of_two_ranks(slurm_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """Its init_distributed_mode reads RANK first: it trains. Both ranks run in the node's one SLURM task
    (SLURM_PROCID=0, SLURM_NTASKS=1 in each), so a copy that reads SLURM_PROCID first asked for rank 0 of 1 in both:
    it is refused, naming the change (with platform.ipc_groups=null, as the refusal said, each rank trained alone)."""
    on_slurm = ("-m", "hydra/launcher=ddpw_slurm", "platform.partition=debug", "platform.n_gpus_per_node=0",
                "platform.n_procs_per_node=2", "platform.timeout_min=5", "hydra.sweep.subdir=.")
    proc = run_app(tmp_path, *on_slurm, f"hydra.sweep.dir={tmp_path / 'rank'}", app="vision_repo.py")
    assert proc.returncode == 0, proc.stderr
    assert "Averaged stats:" in (tmp_path / "rank" / "rank_0.log").read_text()
    for groups in ("[]", "null"):
        proc = run_app(tmp_path, *on_slurm, f"hydra.sweep.dir={tmp_path / 'slurm'}", "slurm_first=true",
                       f"platform.ipc_groups={groups}", app="vision_repo.py")
        assert proc.returncode == 1, proc.stdout
        assert ("platform.n_procs_per_node=2: init_process_group(rank=0, world_size=1) follows SLURM_PROCID=0, "
                "SLURM_NTASKS=1, which this node's 2 ranks share") in proc.stderr


@pytest.mark.subprocess
def test_a_plain_run_under_a_bare_srun_spans_the_steps_nodes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """`srun -N2 --ntasks-per-node=1 python app.py platform.n_nodes=2` with a local launcher, as inside an
    allocation without `ddpw_slurm`: each copy is placed by the step's variables (node rank SLURM_PROCID, node 0
    the step's first host), and the two run one job, reported once, in node 0's output dir."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", f"--chdir={tmp_path}", sys.executable, str(APPS / "app.py"),
         "hydra/launcher=ddpw_cpu", "platform.n_nodes=2", "platform.n_procs_per_node=1"],
        env={**os.environ, "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}, capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    [job] = job_dirs(tmp_path)  # one output dir: node 1 took node 0's
    ranks = seen(job)
    assert {r: d["env"]["GROUP_RANK"] for r, d in ranks.items()} == {0: "0", 1: "1"}  # node = SLURM_PROCID
    assert {d["world_size"] for d in ranks.values()} == {2} and ranks[0]["all_reduce_world"] == 2.0
    assert {d["env"]["MASTER_ADDR"] for d in ranks.values()} == {"n1"}  # the step's first host
    assert proc.stdout.count("COMPLETED") == 1  # node 0's report
    assert leftover(ranks) == []


@pytest.mark.subprocess
def test_partition_sweep_submits_one_job_per_partition(slurm_env: dict[str, str], tmp_path: Path) -> None:
    proc = run(tmp_path, "-m", "platform.partition=debug,cpu2", "platform.n_procs_per_node=1")
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [seen(job)[0]["env"]["SLURM_JOB_PARTITION"] for job in jobs] == ["debug", "cpu2"]
    ids = [entry["slurm_job_id"] for entry in manifest(jobs[0].parent)]
    assert len(set(ids)) == 2 and not any("_" in i for i in ids)  # two submissions, no array


@pytest.mark.subprocess
def test_jobs_with_equal_resources_go_out_as_one_job_array(slurm_env: dict[str, str], tmp_path: Path) -> None:
    proc = run(tmp_path, "-m", "lr=1,2,3,4", "platform.n_procs_per_node=1")
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [seen(job)[0]["lr"] for job in jobs] == [1, 2, 3, 4]
    ids = [entry["slurm_job_id"] for entry in manifest(jobs[0].parent)]
    array = ids[0].split("_")[0]
    assert ids == [f"{array}_{k}" for k in range(4)]  # one sbatch, tasks 0..3
    assert [seen(job)[0]["run_id"] for job in jobs] == ids
    summary = json.loads((jobs[0].parent / "sweep_summary.json").read_text())["jobs"]
    assert [(entry["job"], entry["status"], entry["output_dir"]) for entry in summary] == [
        (k, "COMPLETED", str(job)) for k, job in enumerate(jobs)]
    assert "[ddpw] sweep summary: 4 jobs, 4 COMPLETED" in proc.stdout


@pytest.mark.subprocess
def test_rank_failure_on_the_second_node_is_the_reported_root_cause(slurm_env: dict[str, str], tmp_path: Path) -> None:
    start = time.monotonic()
    proc = run(tmp_path, "platform.n_nodes=2", "platform.n_procs_per_node=1", "behaviour=raise", "fail_rank=1",
               timeout=300)
    assert proc.returncode == 1
    # Not after the peers' collective timeout (30 min); the bound is loose, as a job may wait in SLURM's queue (up to
    # 54 s was seen in a whole run of the suite, this job's own run takes about 10 s).
    assert time.monotonic() - start < 240
    assert "rank 1 (node 1) failed: ValueError: rank asked to fail" in proc.stderr
    assert "--- traceback of rank 1 ---" in proc.stderr
    assert 'raise ValueError("rank asked to fail")' in proc.stderr
    assert "waiting for clients" not in proc.stderr and "Connection closed" not in proc.stderr
    # Every rank is listed: node 0's too, which the failure stopped before it sent how its ranks ended (it was missing).
    # (or node 0 sent rank 0's own end: it failed too, as rank 1's connection closed, before node 1's stop came)
    assert re.search(r"\n  rank 0: (ok|stopped|failed too)", proc.stdout), proc.stdout
    # Rank 0's console, echoed while the job ran, ends before its note of the error that followed (the connection
    # rank 1 closed), as a local job's console stops: it came first on the console, before the real cause.
    assert "hello from rank 0" in proc.stdout
    assert "--- rank 0 failed" not in proc.stdout and "Connection closed" not in proc.stdout, proc.stdout
    _gone(seen(job_dirs(tmp_path)[0]))


@pytest.mark.subprocess
def test_past_the_time_limit_the_rank_holding_up_another_nodes_ranks_is_named(slurm_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    """Rank 0 (node 0) never reaches the barrier rank 1 (node 1) waits in. Each node's time limit stops its ranks; the
    job's error names rank 0 as the one that held up the other, from where every node's ranks were. Node 1's time limit,
    when it came first, cancelled node 0, so the error showed only rank 1 waiting and never named rank 0."""
    # SLURM's own limit is a whole minute; its warning, signal_delay_s (90) before it, would come at slurmctld's first
    # periodic check (within 30 s of the start), at times before the nodes' 6 s: 5 s before it, it comes after them.
    proc = run(tmp_path, "platform.n_nodes=2", "platform.n_procs_per_node=1", "behaviour=hold_up", "fail_rank=0",
               "platform.timeout_min=0.1", "hydra.launcher.signal_delay_s=5", timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "ran past its time limit (platform.timeout_min=0.1)" in proc.stderr, proc.stderr
    assert re.search(r"rank 0: NOT IN THE COLLECTIVE, at hold_up \(.*slurm_app\.py:\d+\)", proc.stderr), proc.stderr
    assert "rank 1: waiting in barrier" in proc.stderr, proc.stderr


@pytest.mark.subprocess
def test_slurms_warning_without_a_restart_left_names_the_rank_holding_up_the_others(
        slurm_env: dict[str, str], tmp_path: Path) -> None:
    """SLURM counts a job's time limit from the job's start, the nodes from their ranks' start, seconds later: with a
    time limit of whole minutes (the usual), SLURM always stopped the job first, reported only as 'reached its time
    limit', and no rank was named. Its warning (SIGUSR2, hydra.launcher.signal_delay_s before the limit; sent here by
    hand, as `scancel --signal=USR2` does) now stops the ranks as the time limit does, naming the one that held up the
    others, where every node's ranks were."""
    out = tmp_path / "run"
    overrides = ("platform.n_nodes=2", "platform.n_procs_per_node=1", "behaviour=hold_up", "fail_rank=0",
                 "platform.timeout_min=10", f"hydra.run.dir={out}")
    proc = start_app(tmp_path, *multirun(*overrides), app=APP)
    try:
        wait_for(lambda: sorted(seen(out)) == [0, 1], timeout=90, what="both ranks to run")
        wait_for(lambda: "waiting in barrier" in subprocess.run(
            [sys.executable, "-m", "ddpw_runtime.launch.where", str(out)], capture_output=True, text=True,
            timeout=60).stdout, timeout=60, what="rank 1 to wait in the barrier")
        (submitted,) = manifest(out)
        slurm("scancel", "--signal=USR2", submitted["slurm_job_id"])  # what SLURM sends before its time limit
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert "SLURM warned the job that its time limit (platform.timeout_min=10) was near" in stderr, stderr
    assert re.search(r"rank 0: NOT IN THE COLLECTIVE, at hold_up \(.*slurm_app\.py:\d+\)", stderr), stderr
    assert "rank 1: waiting in barrier" in stderr, stderr
    _gone(seen(out))


@pytest.mark.subprocess
def test_ranks_on_every_node_use_the_scripts_own_objects_and_tracebacks_name_its_lines(
        slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A node runs no script of its own (its controller is submitit's): the script's class read by a spawn-context
    DataLoader is the script's own on both nodes, and a failure on node 1 shows the script's file and line."""
    app = "script_objects_app.py"
    proc = run_app(tmp_path, "-m", "--config-name", "slurm", "platform.n_nodes=2", "platform.n_procs_per_node=1",
                   "behaviour=ok,raise", app=app, timeout=180)
    assert proc.returncode == 1
    ok, failed = job_dirs(tmp_path)
    ranks = seen(ok)
    assert sorted(ranks) == [0, 1]
    assert all(r["total"] == 28.0 and r["same_class"] and r["same_task"] for r in ranks.values())
    assert "rank 1 (node 1) failed: __main__.DataError: failed on a line of the script" in proc.stderr
    lines = (APPS / app).read_text().splitlines()
    raised = lines.index('    raise DataError("failed on a line of the script")') + 1
    assert (f'  File "{APPS / app}", line {raised}, in fail_here\n'
            '    raise DataError("failed on a line of the script")\n'
            'DataError: failed on a line of the script\n') in proc.stderr  # (as in the script's own process)
    assert "<dynamic-code>" not in proc.stderr


@pytest.mark.subprocess
def test_cancelled_job_is_reported_as_cancelled(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_app(tmp_path, *multirun("behaviour=wait", f"hydra.run.dir={out}"), app=APP)
    try:
        wait_for(lambda: len(list(out.glob("running_rank_*"))) == 2, timeout=90, what="both ranks to run")
        # Asked while it runs, the job on its node says where each rank is, and goes on.
        asked = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(out)], capture_output=True,
                               text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        assert "    rank 0: " in asked.stdout and "    rank 1: " in asked.stdout
        assert "in main" in (out / "stacks_rank_1.txt").read_text()
        (submitted,) = manifest(out)
        slurm("scancel", submitted["slurm_job_id"])
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert time.monotonic() - start < 15  # sacct's state, not submitit's wait for a result file
    assert f"SLURM job {submitted['slurm_job_id']} was cancelled" in stderr
    _gone(seen(out))


@pytest.mark.subprocess
def test_preempted_job_is_requeued_and_resumes_from_its_checkpoint(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = ("behaviour=checkpoint", "hydra.launcher.max_restarts=1", "platform.n_nodes=2",
                 "platform.n_procs_per_node=1", f"hydra.run.dir={out}")
    proc = start_app(tmp_path, *multirun(*overrides), app=APP)
    try:
        wait_for(lambda: len(list(out.glob("running_rank_*"))) == 2, timeout=90, what="both ranks to run")
        (submitted,) = manifest(out)
        job_id = submitted["slurm_job_id"]
        slurm("scancel", "--signal=USR2", job_id)  # what SLURM sends before a time limit or preemption
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    requeued = f"#0 : SLURM job {job_id} was requeued (restart 1): it resumes when SLURM starts it again\n"
    assert stdout.count(requeued) == 1, stdout  # (the console said nothing of it)
    assert stdout.index(requeued) < stdout.index(f"SLURM job {job_id} ended"), stdout
    assert [e["restarts"] for e in json.loads((out / "sweep_summary.json").read_text())["jobs"]] == [1]
    assert "#0   COMPLETED (1 restart)" in stdout, stdout
    saved = seen_files(out, "checkpoint")
    assert sorted(saved) == [0, 1]  # every rank, on both nodes, saved on the first run
    assert all(s["restart_count"] == 0 and s["step"] > 0 for s in saved.values())
    resumed = seen_files(out, "resumed")
    assert {r: d["resumed_from"] for r, d in resumed.items()} == saved
    assert {d["restart_count"] for d in resumed.values()} == {1}
    ranks = seen(out)  # written again by the restart, in the same output dir, with the same run id
    assert {(d["restart_count"], d["run_id"], d["env"]["TORCHELASTIC_RESTART_COUNT"]) for d in ranks.values()} == {
        (1, job_id, "1")
    }
    _gone(ranks)


@pytest.mark.subprocess
def test_fire_and_forget_returns_at_once_with_a_manifest(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run(tmp_path, "hydra.launcher.fire_and_forget=true", "platform.n_procs_per_node=1", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    (submitted,) = manifest(out)
    assert submitted["output_dir"] == str(out)
    wait_for(lambda: 0 in seen(out), timeout=60, what="the job to run on its own")
    assert seen(out)[0]["run_id"] == submitted["slurm_job_id"]


def _signal_the_waiting_program(tmp_path: Path, sig: int) -> tuple[subprocess.Popen, str, str, Path, str]:
    """A one-job sweep whose job runs (and waits), the program that waits for it sent `sig`: the program (ended), its
    stdout and stderr, the sweep dir and the job's SLURM id."""
    sweep = tmp_path / "sw"
    proc = start_app(tmp_path, *multirun("behaviour=wait", "platform.n_procs_per_node=1", f"hydra.run.dir={sweep}"),
                     app=APP)
    try:
        wait_for(lambda: (sweep / "running_rank_0").exists(), timeout=60, what="the job to run")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    (submitted,) = manifest(sweep)
    return proc, out, err, sweep, submitted["slurm_job_id"]


@pytest.mark.subprocess
def test_sigterm_to_the_waiting_program_leaves_its_jobs_running_and_says_how_to_collect_or_cancel_them(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """The jobs are SLURM's (a login node that shuts down sends SIGTERM): they go on, and the program says so, with
    the resume and the scancel that take it from there; it said `no rank was running`, which told neither."""
    proc, _, err, sweep, job_id = _signal_the_waiting_program(tmp_path, signal.SIGTERM)
    try:
        assert proc.returncode == 143, err
        assert "no rank was running" not in err, err
        assert (f"Terminated (SIGTERM): SLURM job(s) {job_id} go on without this program; collect them with the same "
                f"command and hydra.launcher.resume=true hydra.sweep.dir={sweep}, or cancel them with scancel {job_id}"
                in err), err
        assert slurm("squeue", "--noheader", "--format=%T", f"--jobs={job_id}").split() == ["RUNNING"]
    finally:
        slurm("scancel", job_id)


@pytest.mark.subprocess
def test_ctrl_c_to_the_waiting_program_cancels_its_jobs(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Ctrl-C while the job runs cancels it, says so, and exits 130; the summary gives the job its time from its
    submission (it said 0.0 s for a job that had run)."""
    proc, out, err, sweep, job_id = _signal_the_waiting_program(tmp_path, signal.SIGINT)
    assert proc.returncode == 130, err
    assert f"Interrupted: cancelled SLURM job(s) {job_id}" in out, out
    wait_for(lambda: slurm("squeue", "--noheader", f"--jobs={job_id}").strip() == "", timeout=30,
             what="the cancelled job to leave the queue")
    (job,) = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert job["status"] == "INTERRUPTED" and job["duration_s"] > 0, job


@pytest.mark.subprocess
def test_a_failed_job_of_a_slurm_sweep_is_reported_as_it_fails(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """As in a local sweep, `[ddpw] job #N FAILED after ...: <cause>` as the job ends, before the summary; the console
    said only `SLURM job 42_0 ended (every node returned)`, the cause first shown at the sweep's end."""
    proc = run(tmp_path, "lr=0.1,0.2", "behaviour=raise", "fail_rank=0", "platform.n_procs_per_node=1",
               f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert proc.returncode == 1, proc.stderr
    for job in (0, 1):
        line = f"[ddpw] job #{job} FAILED after "
        assert line in proc.stdout, proc.stdout
        assert proc.stdout.index(line) < proc.stdout.index("[ddpw] sweep summary"), proc.stdout
        assert proc.stdout.split(line)[1].split("\n")[0].endswith(": rank 0 failed: ValueError: rank asked to fail")


@pytest.mark.subprocess
def test_a_job_that_can_never_start_is_cancelled_at_once_saying_why_and_the_sweep_goes_on(
        slurm_env: dict[str, str], tmp_path: Path) -> None:
    """3 nodes of a 2-node partition: sbatch takes the job, which then waits for ever (PENDING, PartitionConfig);
    the sweep waited silently, for ever. Now the job is cancelled as SLURM gives that reason, and fails with it and the
    key to change; the other job of the sweep runs."""
    sweep = tmp_path / "sw"
    proc = run(tmp_path, "platform.n_nodes=1,3", "platform.n_procs_per_node=1", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stderr
    never = manifest(sweep)[1]["slurm_job_id"]
    line = proc.stdout.split("[ddpw] job #1 FAILED after ")[1].split("\n")[0]
    # (SLURM gives PartitionConfig or PartitionNodeLimit, depending on how the partition's nodes are configured)
    assert re.search(rf"SLURM job {never} is pending \((PartitionNodeLimit|PartitionConfig)\) and can never start as "
                     r"asked: .*partition debug .*lower platform\.n_nodes=3", line), proc.stdout
    assert "None" not in line, line  # (the values as a config holds them: null; it said n_cpus_per_node=None)
    assert line.endswith("It was cancelled."), line
    assert "logs: " not in proc.stdout.split("[ddpw] job #1 FAILED after ")[1], proc.stdout  # it has none
    assert slurm("squeue", "--noheader", f"--jobs={never}").strip() == ""
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [e["status"] for e in jobs] == ["COMPLETED", "FAILED"]


@pytest.mark.subprocess
def test_a_job_sbatch_refuses_names_the_key_to_change_and_says_it_once(slurm_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """A partition the cluster does not have: sbatch's refusal was shown twice (submitit printed it too), and named
    no key; now once, with the key, its value and the fix."""
    proc = run(tmp_path, "platform.partition=nope", f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert proc.returncode == 1, proc.stderr
    assert ("SLURM refused job(s) #0: SLURM has no partition 'nope': change platform.partition to one sinfo lists"
            in proc.stderr), proc.stderr
    assert proc.stderr.count("Invalid partition name specified") == 1, proc.stderr
    assert not (tmp_path / "sw" / MANIFEST).exists()


@pytest.mark.subprocess
def test_when_sbatch_refuses_a_later_job_of_a_sweep_the_summary_says_no_job_started(slurm_env: dict[str, str],
                                                                                      tmp_path: Path) -> None:
    """Job #0 went out, sbatch refused #1 and #0 was cancelled: the summary said `1 job, 1 SUBMITTED` (what a sweep
    whose process was killed leaves, its job running on) and left #1 out; now every job is NOT STARTED."""
    sweep = tmp_path / "sw"
    proc = run(tmp_path, "-m", "platform.partition=debug,nope", "platform.n_procs_per_node=1",
               f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stderr
    assert "SLURM refused job(s) #1: SLURM has no partition 'nope'" in proc.stderr, proc.stderr
    (cancelled,) = manifest(sweep)
    wait_for(lambda: not slurm("squeue", "--noheader", "--states=PENDING,RUNNING,COMPLETING",
                               f"--jobs={cancelled['slurm_job_id']}").strip(), timeout=30,
             what="the submitted job to be cancelled")
    summary = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [(e["job"], e["status"]) for e in summary] == [(0, "NOT STARTED"), (1, "NOT STARTED")], summary
    assert "sweep summary: 2 jobs, 2 NOT STARTED" in proc.stdout, proc.stdout


@pytest.mark.subprocess
def test_a_failed_setup_line_ends_the_job_naming_it(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A line of hydra.launcher.setup that fails (a `module load` or an `activate` that is not there) ends the job, the
    line named on the console; the batch script went on and the nodes started without it (the job completed)."""
    proc = run(tmp_path, "hydra.launcher.setup=[no_such_command]", "platform.n_procs_per_node=1",
               f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert proc.returncode == 1, proc.stdout
    assert "hydra-ddpw: a line of hydra.launcher.setup failed (exit 127): no_such_command" in proc.stderr, proc.stderr
    assert not list((tmp_path / "sw").glob("*/seen_rank_*.json"))  # no rank ran


@pytest.mark.subprocess
def test_a_job_pending_for_resources_says_so_once_and_waits(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Both nodes are held by another job: the console says the job is pending and why, once, and the job runs when
    they are free (it said nothing while the job waited)."""
    hold = tmp_path / "hold"
    hold.touch()
    blocker = slurm("sbatch", "--parsable", "--nodes=2", "--exclusive", f"--output={tmp_path / 'blocker.out'}",
                    f"--wrap=while [ -e {hold} ]; do sleep 0.1; done").strip()
    lines: list[str] = []
    try:
        wait_for(lambda: slurm("squeue", "--noheader", "--format=%T", f"--jobs={blocker}").strip() == "RUNNING",
                 timeout=60, what="the blocking job to run")
        proc = start_app(tmp_path, *multirun("platform.n_procs_per_node=1", f"hydra.sweep.dir={tmp_path / 'sw'}"),
                         app=APP)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any(" is pending (" in line for line in lines), timeout=60, what="the pending line")
            hold.unlink()
            _, stderr = proc.communicate(timeout=120)
            reader.join(timeout=10)
        finally:
            proc.kill()
    finally:
        slurm("scancel", blocker)
    assert proc.returncode == 0, stderr
    (submitted,) = manifest(tmp_path / "sw")
    pending = [line.split("[HYDRA] ", 1)[-1] for line in lines if " is pending (" in line]  # (after Hydra's prefix)
    assert pending == [f"#0 : SLURM job {submitted['slurm_job_id']} is pending (Resources): it waits for free nodes\n"
                       ], lines


LAGGING_SACCT = "#!/bin/sh\necho 'JobID|State|NodeList'\n"
"""A `sacct` whose accounting database has not recorded any job yet (slurmdbd lags behind the controller): the one
thing here that stands in for SLURM, since the real lag cannot be made to order."""


@pytest.mark.subprocess
@pytest.mark.parametrize("accounting", ["sacct", "lagging"])
def test_a_sweep_whose_submitting_process_was_killed_resumes_without_submitting_again(
    slurm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accounting: str
) -> None:
    """`lagging`: the resume's sacct does not know the jobs yet; squeue does, and the running job is waited for, not
    run a second time (it was submitted again, as a job sacct had never heard of)."""
    holds, sweep = tmp_path / "holds", tmp_path / "sw"
    holds.mkdir()
    for job in (1, 2):
        (holds / f"hold_{job}").touch()  # jobs #1 and #2 hold until theirs is gone; job #0 ends at once
    overrides = ("-m", "lr=0.1,0.2,0.3", "behaviour=hold", f"holds={holds}", "platform.n_procs_per_node=1",
                 f"hydra.sweep.dir={sweep}")

    def status(job: int) -> str | None:
        path = sweep / "sweep_summary.json"
        jobs = json.loads(path.read_text())["jobs"] if path.exists() else []
        return next((e["status"] for e in jobs if e["job"] == job), None)

    proc = start_app(tmp_path, *overrides, app=APP)
    try:
        wait_for(lambda: status(0) == "COMPLETED" and all((sweep / f"{job}" / "running_rank_0").exists()
                                                         for job in (1, 2)), timeout=90, what="jobs #1, #2 to run")
    finally:
        proc.kill()  # SIGKILL, while jobs #1 and #2 run
        proc.communicate()
    submitted = manifest(sweep)
    assert [e["job"] for e in submitted] == [0, 1, 2]
    (holds / "hold_1").unlink()  # job #1 ends while no one waits for it
    id_1 = submitted[1]["slurm_job_id"]
    wait_for(lambda: (sweep / ".submitit" / id_1 / f"{id_1}_0_result.pkl").exists(), timeout=60,
             what="job #1 to end")

    if accounting == "lagging":
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "sacct").write_text(LAGGING_SACCT)
        (shim / "sacct").chmod(0o755)
        monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    resumed = start_app(tmp_path, *overrides, "hydra.launcher.resume=true", app=APP)
    try:
        wait_for(lambda: status(1) == "COMPLETED", timeout=60, what="job #1 to be collected")
        (holds / "hold_2").unlink()  # job #2 ends while the resumed sweep waits for it
        stdout, stderr = resumed.communicate(timeout=120)
    finally:
        resumed.kill()
    assert resumed.returncode == 0, stderr
    assert manifest(sweep) == submitted  # nothing submitted again
    assert f"SLURM job {id_1} of the earlier run COMPLETED meanwhile: collected" in stdout
    assert f"waiting for SLURM job {submitted[2]['slurm_job_id']}" in stdout
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [(e["status"], e["kept"], e["return_value"]) for e in jobs] == [
        ("COMPLETED", True, {"rank": 0, "world_size": 1, "lr": lr}) for lr in (0.1,)] + [
        ("COMPLETED", False, {"rank": 0, "world_size": 1, "lr": lr}) for lr in (0.2, 0.3)]
    assert "3 jobs, 3 COMPLETED (1 kept)" in stdout
    # The collected job's time is its own, from its submission to its result (it was 0.0 s).
    ended = (sweep / ".submitit" / id_1 / f"{id_1}_0_result.pkl").stat().st_mtime
    assert jobs[1]["duration_s"] == round(ended - submitted[1]["submitted_at"], 3) > 0


@pytest.mark.subprocess
# ----------------------------------------------------------------------------- no cluster needed
def test_jobs_that_would_share_a_fixed_master_port_are_refused_before_any_is_submitted(tmp_path: Path) -> None:
    proc = run(tmp_path, "platform.master_port=29555", "lr=0.1,0.2", "hydra.sweep.dir=sweep")
    assert proc.returncode == 1
    assert "platform.master_port=29555: jobs #0, #1 of this sweep set it" in proc.stderr
    assert "leave platform.master_port unset (null)" in proc.stderr
    assert not (tmp_path / "sweep" / MANIFEST).exists()  # nothing was submitted
    alone = run(tmp_path, "platform.master_port=29555", "lr=0.1", "hydra.launcher.dry_run=true")
    assert alone.returncode == 0, alone.stderr  # one job may fix its port


@pytest.mark.subprocess
def test_a_plain_run_is_refused_with_the_command_that_submits_it(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "platform.n_procs_per_node=1", app=APP)
    assert proc.returncode == 1
    assert "hydra/launcher='ddpw_slurm': jobs are submitted to SLURM in a multirun: add -m" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.rglob(".submitit"))


@pytest.mark.subprocess
def test_dry_run_prints_the_sbatch_script_and_plan_and_submits_nothing(tmp_path: Path) -> None:
    proc = run(
        tmp_path, "-m", "lr=1,2", "platform.n_nodes=2", "platform.n_procs_per_node=1", "platform.n_cpus_per_node=2",
        "platform.mem_per_node=4", "hydra.launcher.dry_run=true", "hydra.launcher.qos=high",
        "hydra.launcher.setup=[module load cuda]", "+platform.slurm_additional_parameters.comment=hello",
    )
    assert proc.returncode == 0, proc.stderr
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --partition=debug", "#SBATCH --time=5", "#SBATCH --mem=4GB", "#SBATCH --qos=high",
                 "#SBATCH --comment=hello", "#SBATCH --signal=USR2@90", "#SBATCH --array=0-1%2",
                 "\nmodule load cuda\n", "--kill-on-bad-exit=1", "-m submitit.core._submit"):
        assert line in proc.stdout
    assert proc.stdout.count("=== sbatch script") == 1  # equal resources: one array
    assert "--- job #0: lr=1" in proc.stdout and "--- job #1: lr=2" in proc.stdout
    assert "tcp://<first node of the allocation>:<20000 + SLURM job id % 20000>" in proc.stdout
    assert not list(tmp_path.rglob(MANIFEST)) and not list(tmp_path.rglob(".submitit"))


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "override, key",
    [
        ("hydra.launcher.setup=['echo ok\nscancel --user=root']", "hydra.launcher.setup[0]"),
        ("hydra.launcher.qos='high --wrap=evil'", "hydra.launcher.qos"),
    ],
)
def test_values_that_would_change_the_sbatch_script_are_refused(tmp_path: Path, override: str, key: str) -> None:
    proc = run(tmp_path, "hydra.launcher.dry_run=true", override)
    assert proc.returncode == 1
    assert f"{key}=" in proc.stderr and "#!/bin/bash" not in proc.stdout


@pytest.mark.parametrize(
    "options, platform, key",
    [
        ({"setup": ["module load cuda\r#SBATCH --x"]}, {}, "hydra.launcher.setup[0]"),
        ({"setup": ["if true; then"]}, {}, "hydra.launcher.setup[0]"),  # (accepted: no batch script with it runs)
        ({"setup": ["module load cuda", 'echo "unclosed']}, {}, "hydra.launcher.setup[1]"),
        ({"account": "-A other"}, {}, "hydra.launcher.account"),
        ({"exclude": "n1\nn2"}, {}, "hydra.launcher.exclude"),
        ({"constraint": "a100 --wrap=x"}, {}, "hydra.launcher.constraint"),
        ({"submitit_folder": "logs/%A_%a"}, {}, "hydra.launcher.submitit_folder"),
        ({"max_restarts": 1, "interrupt_grace_s": 120}, {}, "hydra.launcher.interrupt_grace_s"),
        ({}, {"name": "job\n#SBATCH --x"}, "platform.name"),
        ({}, {"partition": "debug --qos=high"}, "platform.partition"),
        ({}, {"slurm_additional_parameters": {"comment": "x\n#SBATCH --x"}},
         "platform.slurm_additional_parameters.comment"),
        ({}, {"slurm_additional_parameters": {"ntasks-per-node": 4}}, "platform.slurm_additional_parameters"),
        ({}, {"slurm_additional_parameters": {"wrap x": 1}}, "platform.slurm_additional_parameters"),
        ({}, {"device": "cpu"}, "platform.device"),
        ({"max_restarts": 1}, {"timeout_min": 1}, "hydra.launcher.signal_delay_s"),
    ],
)
def test_every_value_for_the_sbatch_script_is_checked(options: dict, platform: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        SlurmLauncherConf(**options).validate()
        SlurmLauncherConf(**options).validate_platform(Platform(**{"device": "slurm", **platform}).validate())
    assert info.value.key == key


def test_setup_lines_bash_reads_as_one_script_are_kept() -> None:
    """An `if` over several entries is a script bash reads (each line alone would not be)."""
    lines = ["if [ -f ~/.cluster_env ]; then", "source ~/.cluster_env", "fi", "module load cuda/12.4"]
    assert SlurmLauncherConf(setup=lines).validate().setup == lines


def test_sbatch_parameters_follow_the_platform() -> None:
    options = SlurmLauncherConf(account="proj")
    gpus = Platform(device="slurm", n_nodes=4, n_gpus_per_node=8, mem_per_node=64, timeout_min=90.5, partition="a100")
    params = sbatch_parameters(gpus, options)
    assert params["nodes"] == 4 and params["ntasks_per_node"] == 1 and params["gpus_per_node"] == 8
    assert params["cpus_per_task"] == 8 and params["mem"] == "64GB" and params["time"] == 91
    assert params["partition"] == "a100" and params["account"] == "proj"
    cpus = Platform(device="slurm", n_gpus_per_node=0, n_procs_per_node=4, n_cpus_per_node=16)
    assert "gpus_per_node" not in sbatch_parameters(cpus, options)
    assert sbatch_parameters(cpus, options)["cpus_per_task"] == 16
    gres = Platform(device="slurm", n_gpus_per_node=2, slurm_additional_parameters={"gres": "gpu:a100:2"})
    assert "gpus_per_node" not in sbatch_parameters(gres, options)  # the user's gres asks for them


def _failed(rank: int, node: int, message: str, at: float) -> NodeOutcome:
    """A node whose rank `rank` raised `message` at time `at`."""
    result = RankResult(rank, error=RaisedError("RuntimeError", message, ""), finished_at=at)
    return NodeOutcome(node, 0, ranks=[RankOutcome(rank, node, result, 1, ended_at=at)])


def test_a_cancelled_job_is_reported_as_cancelled_not_as_a_lost_connection() -> None:
    lost = _failed(0, 0, "Connection closed by peer", at=1.0)
    ended = SlurmJobError("SLURM job 7 was cancelled")
    ret, _ = job_return(JobReturn(status=JobStatus.FAILED), 2, 1, "CANCELLED by 0", {0: lost}, {}, ended)
    assert ret.status is JobStatus.FAILED and ret._return_value is ended
    own = _failed(3, 1, "bad batch", at=2.0)
    ret, _ = job_return(JobReturn(status=JobStatus.FAILED), 2, 1, "CANCELLED by 0", {0: lost, 1: own}, {}, ended)
    assert isinstance(ret._return_value, RankFailure) and ret._return_value.rank == 3  # a rank's own failure first
    ok = NodeOutcome(0, 0, ["a"], job_return=JobReturn(status=JobStatus.COMPLETED, _return_value="a"))
    done, values = job_return(ok.job_return, 2, 1, "COMPLETED", {0: ok, 1: NodeOutcome(1, 0, ["b"])}, {}, ended)  # type: ignore[arg-type]
    assert done.return_value == "a" and values == ["a", "b"]


def test_the_default_partition_is_the_clusters_own() -> None:
    from ddpw_runtime.slurm.sbatch import sbatch_script

    params = sbatch_parameters(Platform(device="slurm"), SlurmLauncherConf())
    assert "partition" not in params
    assert "--partition" not in sbatch_script(params, Path("/tmp/ddpw-submitit/%j"))
    assert sbatch_parameters(Platform(device="slurm", partition="cpu2"), SlurmLauncherConf())["partition"] == "cpu2"
