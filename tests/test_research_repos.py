"""Research repos of every style, run from the command line alone: a script written for torchrun (it
makes and destroys its own process group, reads `--local_rank` from its config), a Fabric script and a
Lightning Trainer left at one device, a sweep whose run dir uses `${now:}`, and an app whose config
has a `platform` key of its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpw_conf import ConfigError, Platform
from ddpw_runtime import Wrapper
from ddpw_runtime.launch.plan import free_port
from ddpw_runtime.rank.libraries import mismatch
from ddpw_runtime.rank.task_init import _rendezvous_port
from tests.helpers import APPS, job_dirs, run_app, run_ranks, seen
from tests.lightning_entry_points import register_library_checks

LOCAL_RANK_FROM_ENV = 'local_rank="${oc.decode:${oc.env:LOCAL_RANK}}"'
"""The override that gives a repo written for torch.distributed.launch its `--local_rank` (docs/from-torchrun.md)."""


def torchrun_repo(cwd: Path, *overrides: str, flags: tuple[str, ...] = ()) -> Any:
    return run_app(cwd, *flags, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", *overrides,
                   app="torchrun_repo.py")


# ---------------------------------------------------------------- a script written for torchrun


@pytest.mark.subprocess
@pytest.mark.parametrize("groups", ["[]", "null"])
def test_a_torchrun_script_runs_unchanged_in_a_plain_run(tmp_path: Path, groups: str) -> None:
    proc = torchrun_repo(tmp_path, f"platform.ipc_groups={groups}", LOCAL_RANK_FROM_ENV)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    for rank, data in ranks.items():
        assert data["world_size"] == 2 and data["total"] == 3.0  # one world: 1 + 2 summed over both ranks
        assert data["local_rank"] == data["env_local_rank"] == rank  # an int, as --local_rank gave it


@pytest.mark.subprocess
def test_the_local_rank_override_read_from_the_environment_works_in_a_sweep_too(tmp_path: Path) -> None:
    """Only a rank can resolve it: the sweep's record keeps it as typed."""
    proc = torchrun_repo(tmp_path, LOCAL_RANK_FROM_ENV, flags=("-m",))
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert {rank: (data["local_rank"], data["env_local_rank"]) for rank, data in seen(job).items()} == {
        0: (0, 0), 1: (1, 1)}
    record = json.loads((job.parent / "sweep_summary.json").read_text())["sweep"]
    assert any("${oc.env:LOCAL_RANK}" in override for override in record["overrides"]), record


@pytest.mark.subprocess
def test_a_torchrun_script_runs_unchanged_in_a_sweep_with_each_way_to_make_its_group(tmp_path: Path) -> None:
    proc = torchrun_repo(tmp_path, "init=plain,backend,env", "platform.ipc_groups=[],null", flags=("-m",))
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 6
    for job in jobs:
        ranks = seen(job)
        assert sorted(ranks) == [0, 1], job
        assert all(data["world_size"] == 2 and data["total"] == 3.0 for data in ranks.values()), ranks
        assert all(data["local_rank"] == -1 for data in ranks.values())  # the repo's default, without the override


@pytest.mark.subprocess
@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain", "multirun"])
def test_a_torchrun_scripts_init_through_a_name_bound_at_import_says_why_and_names_the_fix(
        tmp_path: Path, flags: tuple[str, ...]) -> None:
    """`from torch.distributed import init_process_group` at the top of the script is torch's own function, which
    cannot join the group hydra-ddpw made: the failure says so and names `platform.ipc_groups=null`, and with
    that the same script runs."""
    proc = torchrun_repo(tmp_path, "init=bound", flags=flags)
    assert proc.returncode == 1
    assert "platform.ipc_groups=[]: the task called torch's own init_process_group" in proc.stderr
    assert "set platform.ipc_groups=null, so that hydra-ddpw makes no process group" in proc.stderr
    assert "trying to initialize the default process group twice" not in proc.stdout  # not the bare error
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    proc = torchrun_repo(fixed, "init=bound", "platform.ipc_groups=null", flags=flags)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(fixed)
    assert all(data["total"] == 3.0 for data in seen(job).values())


def torchrun_task(call: str) -> tuple[bool, float]:
    """What a torchrun script does with its group: make it (`call`), sum the ranks, destroy it."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    calls: dict[str, Any] = {"plain": {}, "backend": {"backend": "gloo"}, "env": {"init_method": "env://"},
                             "nccl": {"backend": "nccl"}, "timeout": {"timeout": timedelta(days=1)},
                             "world_of_one": {"rank": 0, "world_size": 1}}
    dist.init_process_group(**calls[call])
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return dist.is_initialized(), total.item()


@pytest.mark.subprocess
@pytest.mark.parametrize("groups", [[], None])
def test_a_torchrun_task_in_the_callers_process_leaves_it_ready_for_the_next_job(
    tmp_path: Path, groups: list[list[int]] | None
) -> None:
    platform = Platform(n_procs_per_node=2, verbose=False, ipc_groups=groups)
    for call in ("plain", "env"):
        values = Wrapper(platform, log_dir=tmp_path, caller_rank=True).start(torchrun_task, call)
        assert values == [(False, 3.0), (False, 3.0)]
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert dist.init_process_group.__module__ == "torch.distributed.distributed_c10d"  # torch's own again
    import torch.multiprocessing

    assert torch.multiprocessing.start_processes.__module__ == "torch.multiprocessing.spawn"


@pytest.mark.subprocess
def test_a_torchrun_task_whose_ranks_are_processes_of_their_own_joins_one_world(tmp_path: Path) -> None:
    values = run_ranks(torchrun_task, "backend", platform=Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path)
    assert values == [(False, 3.0), (False, 3.0)]


@pytest.mark.subprocess
@pytest.mark.parametrize(("call", "key", "fix"), [
    ("nccl", "platform.backend", "set platform.backend=nccl, or platform.ipc_groups=null"),
    ("timeout", "platform.collective_timeout_min",
     "set platform.collective_timeout_min=1440, or platform.ipc_groups=null"),
])
def test_a_call_that_asks_for_another_group_names_the_setting(tmp_path: Path, call: str, key: str, fix: str) -> None:
    with pytest.raises(Exception) as failure:
        Wrapper(Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path).start(torchrun_task, call)
    assert f"ConfigError: {key}=" in str(failure.value) and fix in str(failure.value)
    assert "twice" not in str(failure.value)


@pytest.mark.subprocess
def test_a_script_that_starts_its_own_ranks_with_mp_spawn_fails_at_once_naming_the_change(tmp_path: Path) -> None:
    # Its processes, started in a rank, have that rank's RANK and WORLD_SIZE and, as under torchrun,
    # TORCHELASTIC_USE_AGENT_STORE: the group they make at the port the script sets waited for a store nobody
    # hosts, and the job hung until its time limit (30 minutes in init_process_group, were the limit longer).
    proc = run_app(tmp_path, "hydra/launcher=ddpw_cpu", "+n_procs=2", "platform.timeout_min=1", app="spawn_repo.py")
    assert proc.returncode == 1
    assert ("platform.n_procs_per_node=1: 2 processes that mp.spawn started in rank 0 of 1 call init_process_group, "
            "each with rank 0's RANK and rendezvous: call the function in each rank") in proc.stderr
    assert "with platform.n_procs_per_node=2 (docs/from-torchrun.md)" in proc.stderr
    assert "JobTimedOut" not in proc.stdout + proc.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("groups", ["[]", "null"])
def test_the_documented_change_runs_an_mp_spawn_script_as_one_job(tmp_path: Path, groups: str) -> None:
    proc = run_app(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", f"platform.ipc_groups={groups}",
                   "+n_procs=2", "+recipe=true", app="spawn_repo.py")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert [(data["world_size"], data["total"]) for data in seen(job).values()] == [(2, 3.0)] * 2


@pytest.mark.subprocess
def test_a_rank_that_sets_its_own_master_port_without_a_group_made_fails_at_once_naming_the_fix(tmp_path: Path) -> None:
    # Half the documented change: ddp_main runs in each rank but still sets MASTER_PORT. With platform.ipc_groups=null
    # its init_process_group made every rank a client of a store at that port that nobody hosts (as under torchrun),
    # and the job hung until its time limit (30 minutes in init_process_group, were the limit longer).
    port = free_port("127.0.0.1")
    half_done = ("+n_procs=2", "+recipe=ranks_only", f"+port={port}")
    proc = run_app(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", "platform.ipc_groups=null",
                   "platform.timeout_min=1", *half_done, app="spawn_repo.py")
    assert proc.returncode == 1
    refusal = (f"ConfigError: platform.master_port=None: the task's init_process_group() looks for its store at port "
               f"{port}, which nothing hosts (hydra-ddpw hosts this job's at 127.0.0.1:")
    # (both ranks refuse; either may be first: the job's line names it, and Hydra shows rank 0's own error as its own)
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("[ddpw] job #0 FAILED after "))
    assert refusal in summary  # and not cut:
    assert summary.endswith(f"In the task, do not set MASTER_PORT; or set platform.master_port={port}")
    assert "JobTimedOut" not in proc.stdout + proc.stderr
    # The port it names runs it; with the group hydra-ddpw makes (the default), the port the task sets is not used
    for name, fix in (("port", f"platform.master_port={port}"), ("group", "platform.ipc_groups=[]")):
        (tmp_path / name).mkdir()
        fixed = run_app(tmp_path / name, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", fix, *half_done,
                        app="spawn_repo.py")
        assert fixed.returncode == 0, fixed.stderr
        (job,) = job_dirs(tmp_path / name)
        assert [(data["world_size"], data["total"]) for data in seen(job).values()] == [(2, 3.0)] * 2


def test_the_port_a_call_looks_for_its_store_at(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_PORT", "1234")
    assert [_rendezvous_port(asked) for asked in ({}, {"init_method": "env://"}, {"init_method": "tcp://h:12355"},
                                                  {"init_method": "file:///x"}, {"store": object()})] == \
        [1234, 1234, 12355, None, None]


@pytest.mark.parametrize(("change", "key"), [
    ({"ipc_protocol": "file"}, "platform.ipc_protocol"),
    ({"layout": {"tensor": 2}}, "platform.ipc_groups"),
])
def test_no_process_group_needs_the_tcp_rendezvous_and_no_layout(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Platform(n_procs_per_node=2, ipc_groups=None, **change).validate()
    assert refused.value.key == key


# ---------------------------------------------------------------- Lightning and Fabric left at one device


def test_the_message_names_the_librarys_setting_and_the_config_key() -> None:
    message = mismatch("Fabric", 1, 1, 1, (2, 2, 1), "fabric")
    assert message is not None and "use Fabric(devices=2, num_nodes=1) (here: fabric.devices=2)" in message
    message = mismatch("Trainer", 4, 2, 2, (8, 4, 2), None)
    assert message is not None and "Trainer(devices=2, num_nodes=2) would run 4 process(es) in a job of 8" in message
    assert "use Trainer(devices=4, num_nodes=2), or leave devices and num_nodes unset" in message
    assert mismatch("Trainer", 2, 2, 1, (2, 2, 1), "trainer") is None


def fit_lightning(devices: int | None) -> int:
    """A Lightning fit on 8 random samples; the world size the Trainer saw. `devices=None`: not given
(an explicit value, "auto" included, wins over `PL_TRAINER_DEVICES`)."""
    import lightning as L

    from tests.lightning_tiny import Tiny, samples

    chosen: dict[str, Any] = {} if devices is None else {"devices": devices}
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **chosen)
    trainer.fit(Tiny(), samples())
    return int(trainer.world_size)


def lightning_after_a_collective(devices: int | None) -> int:
    """A collective first (as torchmetrics' sync does), then a Lightning fit; the Trainer's world size."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    return fit_lightning(devices)


@pytest.mark.subprocess
def test_a_trainer_left_at_one_device_is_stopped_before_it_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    platform = Platform(n_procs_per_node=2, verbose=False)
    with pytest.raises(Exception) as stopped:
        Wrapper(platform, log_dir=tmp_path / "one").start(lightning_after_a_collective, 1)
    assert "LibraryWorldMismatch: Trainer(devices=1, num_nodes=1) would run 1 process(es) in a job of 2" in str(
        stopped.value)
    assert "Trainer.fit` stopped" not in (tmp_path / "one" / "rank_0.log").read_text()  # no epoch ran
    assert Wrapper(platform, log_dir=tmp_path / "unset").start(lightning_after_a_collective, None) == [2, 2]


@pytest.mark.subprocess
@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain", "multirun"])
def test_after_a_lightning_fit_each_rank_still_says_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...]
) -> None:
    """A Trainer, as it ends, sets every signal's handler back to what Python had: faulthandler's, which writes a
    rank's stacks when they are asked for, was lost. Asked after a fit, rank 0 of a plain run was killed by the
    request (signal 38, the job failed) and every other rank answered as if it had ended."""
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    proc = run_app(tmp_path, *flags, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                   app="lightning_where_app.py", timeout=240)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    answer = (job / "where.txt").read_text()
    assert "had ended" not in answer, answer
    for rank in (0, 1):  # each in the app's task: rank 0 waits for the answer, rank 1 for rank 0
        assert re.search(rf"rank {rank}: .*at main \(.*lightning_where_app\.py:\d+\)", answer), answer


def fabric_app(cwd: Path, *overrides: str) -> Any:
    return run_app(cwd, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", *overrides, app="fabric_app.py",
                   timeout=240)


@pytest.mark.subprocess
@pytest.mark.parametrize("setup", ["together", "apart"])
def test_a_fabric_left_at_one_device_is_stopped_naming_its_config_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    proc = fabric_app(tmp_path, f"setup={setup}")
    assert proc.returncode == 1
    assert ("LibraryWorldMismatch: Fabric(devices=1, num_nodes=1) would run 1 process(es) in a job of 2 rank(s), so "
            "every rank would train alone: use Fabric(devices=2, num_nodes=1) (here: fabric.devices=2)") in proc.stderr
    assert "Trainer(" not in proc.stderr
    assert not list(tmp_path.rglob("seen_rank_*.json"))  # no rank got to the end of its training


@pytest.mark.subprocess
def test_a_fabric_set_to_the_launched_ranks_trains_once_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    proc = fabric_app(tmp_path, "fabric.devices=2")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert [data["world_size"] for data in seen(job).values()] == [2, 2]


def test_outside_a_rank_the_factories_add_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpw_runtime.rank import libraries

    monkeypatch.delenv("DDPW_JOB", raising=False)
    assert libraries.lightning_callbacks() == [] and libraries.fabric_callbacks() == []


def test_the_config_key_is_found_by_the_target() -> None:
    from ddpw_runtime.rank.libraries import _node_making

    config = json.loads('{"model": {"net": {"_target_": "torch.nn.Linear"}}, "trainer": '
                        '{"_target_": "lightning.pytorch.trainer.Trainer", "devices": 1}}')
    assert _node_making(config, "Trainer") == "trainer" and _node_making(config, "Fabric") is None


# ---------------------------------------------------------------- torchvision references' init_distributed_mode


def vision_repo(cwd: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python tests/apps/vision_repo.py <overrides>` (a repo in the style of torchvision's references/: DeiT, MAE,
    DETR), with `env` added to the environment."""
    return subprocess.run([sys.executable, str(APPS / "vision_repo.py"), *overrides], cwd=cwd, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


@pytest.mark.subprocess
def test_a_repo_in_torchvision_references_style_trains_as_under_torchrun(tmp_path: Path) -> None:
    """Its rank from RANK, its own init_process_group(rank=..., world_size=...), only rank 0 printing (a `print` of its
    own), metrics all-reduced, a DistributedSampler, rank 0 saving: the weights and the metrics are torchrun's, in a
    plain run and in a multirun, and rank 1's log has what it printed with force=True."""
    import torch

    torchrun = tmp_path / "torchrun"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", str(APPS / "vision_repo.py"),
                    f"hydra.run.dir={torchrun}"], cwd=tmp_path, capture_output=True, timeout=120, check=False)
    # (torchrun's exit status is not checked: torch may abort a gloo rank that exits without destroying its group)
    expected = torch.load(torchrun / "checkpoint.pth")["model"]
    plain = vision_repo(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                        f"hydra.run.dir={tmp_path / 'plain'}")
    assert plain.returncode == 0, plain.stderr
    multirun = vision_repo(tmp_path, "-m", "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                           f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert multirun.returncode == 0, multirun.stderr
    for job in (tmp_path / "plain", tmp_path / "multirun" / "0"):
        weights = torch.load(job / "checkpoint.pth")["model"]
        assert all(torch.equal(weights[name], expected[name]) for name in expected), job
        assert (job / "log.txt").read_text() == (torchrun / "log.txt").read_text()
        assert (job / "rank_1.log").read_text().splitlines()[1:] == [
            "rank 1 done with epoch 0", "rank 1 done with epoch 1"]  # after its first line, only what it forced
        assert "Averaged stats:" in (job / "rank_0.log").read_text()


SBATCH_SCRIPT = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
"""What SLURM gives the script of `sbatch --ntasks=1`, where `python train.py hydra/launcher=ddpw_cpu ...` runs (on
ddpw_slurm, each node's SLURM task gives its ranks the same)."""


@pytest.mark.subprocess
@pytest.mark.parametrize("groups", ["[]", "null"])
def test_a_repo_that_reads_slurm_procid_before_rank_fails_naming_the_change(tmp_path: Path, groups: str) -> None:
    """In a SLURM task, such a script gave both ranks of the node its rank and world size (SLURM_PROCID=0,
    SLURM_NTASKS=1). With the group made, the refusal named platform.ipc_groups=null, which ran the job to COMPLETED
    with every rank training alone on the whole data set, both saving: now both say where the rank came from."""
    proc = vision_repo(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                       f"platform.ipc_groups={groups}", "slurm_first=true", env=SBATCH_SCRIPT)
    assert proc.returncode == 1, proc.stdout
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("[ddpw] job #0 FAILED after "))
    assert ("ConfigError: platform.n_procs_per_node=2: init_process_group(rank=0, world_size=1) follows "
            "SLURM_PROCID=0, SLURM_NTASKS=1, which this node's 2 ranks share (one SLURM task per node); this is "
            "RANK=") in summary
    assert summary.endswith("read RANK and WORLD_SIZE before SLURM_PROCID, as torchvision's init_distributed_mode "
                            "does")  # not cut
    assert "hydra-ddpw makes no process group" not in proc.stdout + proc.stderr  # (platform.ipc_groups=null)
    page = " ".join((Path(__file__).parent.parent / "docs" / "from-torchrun.md").read_text().split())
    assert summary.split("ConfigError: ")[1].replace("RANK=0 of", "RANK=1 of") in page  # the page wraps the message
    fixed = vision_repo(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                        f"platform.ipc_groups={groups}", f"hydra.run.dir={tmp_path / 'fixed'}", env=SBATCH_SCRIPT)
    assert fixed.returncode == 0, fixed.stderr
    assert "Averaged stats:" in (tmp_path / "fixed" / "rank_0.log").read_text()


@pytest.mark.subprocess
def test_a_call_for_another_world_size_at_the_jobs_rendezvous_is_refused_with_no_group_made(tmp_path: Path) -> None:
    """With platform.ipc_groups=null, each rank's init_process_group(world_size=1, rank=0) made a world of its own at
    the job's store: the job COMPLETED with every rank alone."""
    with pytest.raises(Exception) as failure:
        Wrapper(Platform(n_procs_per_node=2, ipc_groups=None, verbose=False), log_dir=tmp_path).start(
            torchrun_task, "world_of_one")
    assert ("ConfigError: platform.ipc_groups=None: init_process_group(rank=0, world_size=1) at the job's rendezvous, "
            "in RANK=") in str(failure.value)
    assert "pass rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']), or neither" in str(
        failure.value)


# ---------------------------------------------------------------- ${now:} in a sweep


@pytest.mark.subprocess
def test_each_job_of_a_sweep_has_its_own_now_the_same_in_all_its_ranks(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", "x=1,2,3",
                   app="stamped_app.py")
    assert proc.returncode == 0, proc.stderr
    jobs = [seen(job) for job in job_dirs(tmp_path)]
    assert len(jobs) == 3
    for ranks in jobs:
        assert sorted(ranks) == [0, 1]
        (stamp,) = {data["stamp"] for data in ranks.values()}  # one value in every rank of the job
        assert {Path(data["output_dir"]).name for data in ranks.values()} == {stamp}  # its dir is named with it
    jobs.sort(key=lambda ranks: ranks[0]["stamp"])
    for before, after in zip(jobs, jobs[1:], strict=False):
        # The job's own time: taken when it started, after the job before it had ended (one after another
        # here), as Hydra's basic launcher takes it; not one time for the whole sweep.
        assert after[0]["stamp"] > max(data["ended"] for data in before.values())


# ---------------------------------------------------------------- an app with a `platform` of its own

OWN_PLATFORM = ("hydra/launcher=ddpw_cpu_own_platform", "ddpw_platform.n_procs_per_node=2")
"""The way out that docs/from-torchrun.md gives an app whose config has a `platform` key."""


@pytest.mark.subprocess
@pytest.mark.parametrize("flags", [(), ("-m",)])
def test_an_app_with_its_own_platform_string_runs_with_the_own_platform_launcher(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    proc = run_app(tmp_path, *flags, *OWN_PLATFORM, app="platform_string_app.py")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    assert all(data["world_size"] == 2 and data["platform"] == "linux-x86_64" for data in ranks.values())


@pytest.mark.subprocess
def test_an_app_with_its_own_platform_group_runs_with_the_own_platform_launcher(tmp_path: Path) -> None:
    proc = run_app(tmp_path, *OWN_PLATFORM, app="own_platform_app.py")
    assert proc.returncode == 0, proc.stderr
    assert "cores=4" in proc.stdout and "COMPLETED" in proc.stderr + proc.stdout


@pytest.mark.subprocess
def test_the_collision_and_the_own_platform_errors_are_the_ones_the_page_names(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "from-torchrun.md").read_text()
    way_out = "select the `_own_platform` twin of the launcher option (such as hydra/launcher=ddpw_cpu_own_platform)"
    for flags in [(), ("-m",)]:
        proc = run_app(tmp_path, *flags, "hydra/launcher=ddpw_cpu", app="platform_string_app.py")
        assert proc.returncode == 1
        assert "platform='linux-x86_64': platform must be a mapping of Platform fields" in proc.stderr
        assert way_out in proc.stderr and not job_dirs(tmp_path)  # before any job started
    proc = run_app(tmp_path, "hydra/launcher=ddpw_cpu", app="own_platform_app.py")
    assert proc.returncode == 1 and "platform.cores=4: Platform has no such field" in proc.stderr
    assert way_out in proc.stderr
    page = " ".join(page.split())  # the page wraps the message
    assert "platform must be a mapping of Platform fields" in page and way_out in page
    proc = run_app(tmp_path, *OWN_PLATFORM, "ddpw_platform.n_cpus_per_node=3", app="platform_string_app.py")
    assert proc.returncode == 1
    assert "ddpw_platform.n_cpus_per_node=3: must be a multiple of the 2 rank(s)" in proc.stderr  # the key as typed


# ---------------------------------------------------------------- the sweep summary


def test_the_sweep_summary_shows_what_differs_between_jobs_and_readable_floats(tmp_path: Path) -> None:
    from ddpw_runtime.hydra_jobs.sweep_summary import table

    fixed = [f"model.layer_{n}.width=512" for n in range(13)]
    entries = [{"job": n, "overrides": [*fixed[:7], f"optimizer.lr={lr}", *fixed[7:]], "status": "COMPLETED",
                "duration_s": 41.25, "return_value": value, "output_dir": str(tmp_path / str(n)), "error": None}
               for n, (lr, value) in enumerate([(0.1, 0.9583333134651184), (0.01, {"acc": 0.91666668653488159})])]
    lines = table(entries, tmp_path / "sweep_summary.json", tmp_path).splitlines()
    assert lines[2].split() == ["#0", "COMPLETED", "41.2", "s", "0.9583", "0", "optimizer.lr=0.1"]
    assert lines[3].split()[-1] == "optimizer.lr=0.01" and "{acc: 0.9167}" in lines[3]
    assert lines[4] == "  same in every job: " + " ".join(fixed)
    assert max(len(line) for line in lines[:4]) < 100
    whole = [{**entries[0], "return_value": [2.0, -3.0, 1e-05, 2, float("inf")]}]
    assert "[2.0, -3.0, 1e-05, 2, inf]" in table(whole, tmp_path / "sweep_summary.json", tmp_path)
    lone = table(entries[:1], tmp_path / "sweep_summary.json", tmp_path).splitlines()
    assert lone[2].endswith("optimizer.lr=0.1 " + " ".join(fixed[7:])) and len(lone) == 3  # one job: all of its own
