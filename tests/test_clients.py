"""Lightning, accelerate, hydra-zen and a torchrun-style script with ddpw's ranks: the training code of
`examples/lightning_train.py`, `accelerate_train.py` and `torchrun_style.py`, run by the launcher on 2
CPU ranks (`tests/apps/*_app.py`), each rank reporting what the library saw."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.helpers import job_dirs, leftover, run_app, seen, start_app

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def run_client(tmp_path: Path, app: str, epochs: int, *overrides: str) -> dict[int, dict]:
    """Run `app` (a plain run: one job, 2 ranks, examples/conf/config.yaml, and `overrides`) and return what each rank
    reported, after checking the launch: rank 0 is the program's run (a fork of the program, which
    supervises the job); the rank starter's only child is rank 1; neither rank started a process of its
    own, so the library launched nothing more."""
    proc = run_app(tmp_path, f"epochs={epochs}", *overrides, app=app)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["children"] == [], ranks[0]
    assert ranks[1]["siblings"] == [ranks[1]["pid"]] and ranks[1]["children"] == [], ranks[1]
    for data in ranks.values():
        assert data["world_size"] == 2
    assert sorted(p.name for p in job.glob("rank_*.log")) == ["rank_0.log", "rank_1.log"]
    assert leftover(ranks) == []
    return ranks


def test_lightning_trainer_joins_the_launched_ranks(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "lightning_app.py", epochs=2)
    for rank, data in ranks.items():
        assert data["cluster_environment"] == "TorchElasticEnvironment"  # found a launched job
        assert data["strategy"] == "DDPStrategy"
        assert data["lightning_world_size"] == 2 and data["num_devices"] == 2
        assert data["lightning_global_rank"] == rank and data["lightning_local_rank"] == rank
        assert data["same_process_group"]  # ddpw's group, not a second one
        assert data["rank_zero_only_before_trainer"] == rank  # right before any Trainer exists
        assert data["global_step"] == 2 * 23  # 2 epochs of 1437 samples / 2 ranks / batch 32
        assert data["weights_equal_on_every_rank"]  # DDP kept the replicas in step
        assert data["accuracy"] > 0.5
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]


def test_accelerate_sees_every_rank_and_gathers(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "accelerate_app.py", epochs=1)
    for rank, data in ranks.items():
        assert data["distributed_type"] == "DistributedType.MULTI_CPU"
        assert data["num_processes"] == 2
        assert data["process_index"] == rank and data["local_process_index"] == rank
        assert data["is_main_process"] == (rank == 0)
        assert data["mixed_precision"] == "no"
        assert data["gathered"] == [1, 11]  # every rank's tensor, in rank order
        assert data["accuracy"] > 0.5
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]  # gather_for_metrics: all of the validation set


def test_accelerate_launchs_options_reach_every_rank_through_hydras_env_set(tmp_path: Path) -> None:
    # `accelerate launch --mixed_precision bf16` sets ACCELERATE_MIXED_PRECISION=bf16 for its processes
    # (docs/libraries.md): the job's `hydra.job.env_set` gives every rank the same.
    ranks = run_client(tmp_path, "accelerate_app.py", 1, "+hydra.job.env_set.ACCELERATE_MIXED_PRECISION=bf16")
    assert [data["mixed_precision"] for data in ranks.values()] == ["bf16", "bf16"]
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"] > 0.5


def test_torchrun_style_script_assumptions_hold(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "torchrun_app.py", epochs=1)
    ports = {data["env"]["MASTER_PORT"] for data in ranks.values()}
    run_ids = {data["env"]["TORCHELASTIC_RUN_ID"] for data in ranks.values()}
    assert len(ports) == 1 and len(run_ids) == 1 and None not in run_ids
    for rank, data in ranks.items():
        env = data["env"]
        assert int(env["RANK"]) == data["dist_rank"] == rank
        assert int(env["LOCAL_RANK"]) == data["local_rank"] == rank
        assert int(env["WORLD_SIZE"]) == data["dist_world_size"] == 2
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
        assert env["ROLE_RANK"] == str(rank) and env["ROLE_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        # The script's own calls (the app's, then fit's) join the job's group: one world, no error.
        assert data["own_init"] == "no error"
        assert data["accuracy"] > 0.5


def test_a_program_that_runs_hydra_jobs_itself_with_hydra_zen_runs_each_on_every_rank(tmp_path: Path) -> None:
    # hydra-zen's `launch` composes and runs jobs through Hydra's compose API, where a plain run's `hydra.mode` is
    # unset; one program runs a Wrapper, a plain run, a multirun and a failing plain run, one after another.
    proc = run_app(tmp_path, app="zen_app.py")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = {line["step"]: line for line in lines}
    assert proc.returncode == 3, proc.stderr
    assert steps["wrapper"]["value"] == [0, 1]
    run = steps["run"]["value"]
    assert run["lr"] == 0.1 and run["pids"][0] == steps["run"]["pid"] and len(set(run["pids"])) == 2
    assert [job["lr"] for job in steps["multirun"]["value"]] == [0.2, 0.3]
    assert all(len(set(job["pids"])) == 2 for job in steps["multirun"]["value"])
    failed = steps["failed"]["value"].splitlines()
    assert failed[0] == "RankFailure: rank 1 (node 0) failed: ValueError: rank 1 fails on purpose"
    assert any(line.endswith('zen_app.py", line 22, in task') for line in failed), failed  # the script's own line


@pytest.mark.parametrize("mode", ["run", "multirun"])
def test_a_ctrl_c_after_the_programs_jobs_is_its_own_and_so_is_its_exit_code(tmp_path: Path, mode: str) -> None:
    # A Ctrl-C sent to the program's process (an IDE's stop button) after its run or sweep has ended is the program's:
    # after a plain run it goes on in rank 0's process, which gets it; after a multirun Python's own handler is back.
    # No job is reported stopped; the exit code is the program's.
    proc = start_app(tmp_path, mode, app="zen_then_wait.py")
    assert proc.stdout is not None and proc.stderr is not None
    lines = iter(proc.stdout.readline, "")
    assert f"done: {'[2, 2]' if mode == 'multirun' else 2}; waiting\n" in lines  # (read up to that line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert out == "the program had its Ctrl-C: KeyboardInterrupt\n"
    assert "was stopped" not in err and "no rank was running" not in err, err
    if mode == "run":
        assert "Ctrl-C: the program (its job is over) gets it" in err, err
