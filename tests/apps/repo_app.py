"""A research repo's training script that knows nothing of hydra-ddpw: it is launched with the command
line alone (`hydra/launcher=ddpw_cpu platform.n_procs_per_node=2`). torch is imported only inside the
task. Every rank reports what it sees to `seen_rank_<k>.json` in the job's output dir."""

import json
import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path="conf", config_name="repo")
def train(cfg: DictConfig) -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        ones = torch.ones(1)
        dist.all_reduce(ones)
    log.info(f"info record from rank {rank}")
    output_dir = HydraConfig.get().runtime.output_dir
    seen = {
        "rank": rank,
        "world_size": world,
        "stamp": cfg.stamp,
        "stdout_isatty": sys.stdout.isatty(),
        "stderr_isatty": sys.stderr.isatty(),
        "output_dir": output_dir,
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }
    with open(os.path.join(output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    print(f"hello from rank {rank}", flush=True)
    if cfg.behaviour == "pdb" and rank == 0:
        breakpoint()
    if cfg.behaviour == "raise" and rank == cfg.fail_rank:
        raise ValueError(f"rank {rank} asked to fail")
    if cfg.behaviour == "kill" and rank == cfg.fail_rank:
        os.kill(os.getpid(), 9)
    if world > 1:
        dist.barrier()
    return {"rank": rank}


if __name__ == "__main__":
    train()
