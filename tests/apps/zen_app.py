"""A program that runs Hydra jobs itself, with hydra-zen's `launch` (Hydra's compose API: `hydra.mode` stays unset
in a plain run), after a `Wrapper` call and one after another in the same process: a plain run, a multirun, and a
plain run whose rank 1 fails. Prints one JSON line per step."""

import json
import os
import sys

import torch.distributed as dist
from hydra_zen import launch, make_config

import ddpw_runtime
from ddpw_conf import Platform
from ddpw_runtime import Wrapper

LAUNCHER = ["hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"]


def task(cfg: dict) -> dict:
    """Fail on rank 1 when told to; else every rank's pid, gathered (so every rank joined one job)."""
    if cfg["fail"] and ddpw_runtime.rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    pids: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return {"lr": cfg["lr"], "pids": pids}


def rank_of_wrapper() -> int:
    return dist.get_rank()


def say(step: str, value: object) -> None:
    print(json.dumps({"step": step, "value": value, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    conf = make_config(lr=0.1, fail=False)
    say("wrapper", Wrapper(Platform(n_procs_per_node=2)).start(rank_of_wrapper))
    say("run", launch(conf, task, overrides=LAUNCHER, version_base="1.3").return_value)
    sweep = launch(conf, task, overrides=[*LAUNCHER, "lr=0.2,0.3"], multirun=True, version_base="1.3")
    say("multirun", [job.return_value for job in sweep[0]])
    try:
        launch(conf, task, overrides=[*LAUNCHER, "fail=true"], version_base="1.3")
    except Exception as error:  # noqa: BLE001 - hydra-zen raises the job's error
        say("failed", f"{type(error).__name__}: {error}")
        sys.exit(3)
