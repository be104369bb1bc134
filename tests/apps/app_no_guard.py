"""A Hydra app for the tests: every rank reports what it sees; one rank can be told to misbehave."""

import ctypes
import json
import os
import signal
import threading

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def report(cfg: DictConfig) -> dict:
    """What this rank sees, written to `seen_rank_<k>.json` in the job's output dir."""
    rank = ddpw_runtime.rank()
    group = ddpw_runtime.group()
    members = torch.tensor([float(rank)])
    dist.all_reduce(members, group=group)
    world = torch.tensor([1.0])
    dist.all_reduce(world)
    seen = {
        "rank": rank,
        "world_size": ddpw_runtime.world_size(),
        "local_rank": ddpw_runtime.local_rank(),
        "device": str(ddpw_runtime.device()),
        "group_rank_sum": members.item(),
        "all_reduce_world": world.item(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "output_dir": HydraConfig.get().runtime.output_dir,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "threads": torch.get_num_threads(),
        "cfg_behaviour": cfg.behaviour,
    }
    path = os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json")
    with open(path, "w") as out:
        json.dump(seen, out)
    return seen


def misbehave(behaviour: str) -> object:
    if behaviour == "raise":
        raise ValueError("rank asked to fail")
    if behaviour == "exit":
        os._exit(3)
    if behaviour == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "segfault":
        ctypes.string_at(0)
    if behaviour == "unpicklable":
        return threading.Lock()
    return None


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> object:
    seen = report(cfg)
    print(f"hello from rank {seen['rank']}", flush=True)
    os.write(1, f"raw fd write from rank {seen['rank']}\n".encode())
    if ddpw_runtime.rank() == cfg.fail_rank and cfg.behaviour != "ok":
        odd = misbehave(cfg.behaviour)
        if odd is not None:
            return odd
    dist.barrier()
    return {"rank": seen["rank"], "world_size": seen["world_size"]}



main()
