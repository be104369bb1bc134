"""A Hydra app for the tests: every rank reports what it sees; one rank can be told to misbehave."""

import ctypes
import json
import os
import signal
import sys
import threading
import time

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


def wait_for_signals(rank: int, output_dir: str) -> None:
    """Wait until a signal comes; on SIGTERM, save (write a file) and exit, as a real task would."""

    def save_and_exit(signum: int, frame: object) -> None:
        with open(os.path.join(output_dir, f"saved_rank_{rank}.txt"), "w") as out:
            out.write("saved")
        sys.exit(143)

    signal.signal(signal.SIGTERM, save_and_exit)
    while True:
        signal.pause()


def misbehave(behaviour: str) -> object:
    if behaviour == "hang":
        while True:
            time.sleep(1)
    if behaviour == "flood":
        chunk = "x" * 1023 + "\n"
        for _ in range(50 * 1024):
            sys.stdout.write(chunk)
        raise RuntimeError("failed after a flood of output")
    if behaviour == "raise":
        raise ValueError("rank asked to fail")
    if behaviour == "exit":
        os._exit(3)
    if behaviour == "sysexit":
        sys.exit(4)
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
    if cfg.behaviour == "wait":
        wait_for_signals(seen["rank"], seen["output_dir"])
    odd = None
    if ddpw_runtime.rank() == cfg.fail_rank and cfg.behaviour != "ok":
        odd = misbehave(cfg.behaviour)
    dist.barrier()
    return odd if odd is not None else {"rank": seen["rank"], "world_size": seen["world_size"]}


if __name__ == "__main__":
    main()
