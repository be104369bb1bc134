"""A Hydra app for the SLURM tests: every rank reports what it sees; ranks can fail, wait, hold while a
file says so, or save on SIGTERM and resume after a restart."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK", "SLURM_JOB_ID",
            "SLURM_NODEID", "SLURM_JOB_PARTITION", "SLURM_RESTART_COUNT")


def report(cfg: DictConfig) -> dict:
    """What this rank sees, written to `seen_rank_<k>.json` in the job's output dir."""
    rank = ddpw_runtime.rank()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)  # crosses nodes on a multi-node job
    seen = {
        "rank": rank,
        "world_size": ddpw_runtime.world_size(),
        "local_rank": ddpw_runtime.local_rank(),
        "node_rank": ddpw_runtime.node_rank(),
        "rank_sum": total.item(),
        "run_id": ddpw_runtime.run_id(),
        "restart_count": ddpw_runtime.restart_count(),
        "output_dir": HydraConfig.get().runtime.output_dir,
        "threads": torch.get_num_threads(),
        "lr": cfg.lr,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }
    with open(os.path.join(seen["output_dir"], f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    return seen


def save_or_resume(rank: int, output_dir: Path) -> dict:
    """First run: count steps until SIGTERM, then save the step count and exit. After a restart:
    resume from the saved count."""
    checkpoint = output_dir / f"checkpoint_rank_{rank}.json"
    if checkpoint.exists():
        resumed = {"rank": rank, "resumed_from": json.loads(checkpoint.read_text()),
                   "restart_count": ddpw_runtime.restart_count()}
        (output_dir / f"resumed_rank_{rank}.json").write_text(json.dumps(resumed))
        dist.barrier()
        return resumed
    step = 0

    def save(signum: int, frame: object) -> None:
        checkpoint.write_text(json.dumps({"step": step, "restart_count": ddpw_runtime.restart_count()}))
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    (output_dir / f"running_rank_{rank}").touch()
    while True:
        step += 1
        time.sleep(0.05)


def hold_up() -> None:
    """Never reach the collective the other ranks wait in."""
    while True:
        time.sleep(0.05)


@hydra.main(version_base=None, config_path="conf", config_name="slurm")
def main(cfg: DictConfig) -> object:
    seen = report(cfg)
    rank = seen["rank"]
    print(f"hello from rank {rank}", flush=True)
    if cfg.behaviour == "raise" and rank == cfg.fail_rank:
        raise ValueError("rank asked to fail")
    if cfg.behaviour == "wait":
        (Path(seen["output_dir"]) / f"running_rank_{rank}").touch()
        while True:
            signal.pause()
    if cfg.behaviour == "checkpoint":
        return save_or_resume(rank, Path(seen["output_dir"]))
    if cfg.behaviour == "hold_up" and rank == cfg.fail_rank:  # the others wait for it in the barrier below
        hold_up()
    if cfg.behaviour == "hold":
        (Path(seen["output_dir"]) / f"running_rank_{rank}").touch()
        while (Path(cfg.holds) / f"hold_{HydraConfig.get().job.num}").exists():
            time.sleep(0.05)
    dist.barrier()
    return {"rank": rank, "world_size": seen["world_size"], "lr": cfg.lr}


if __name__ == "__main__":
    main()
