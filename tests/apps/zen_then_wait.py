"""A program whose run or multirun (hydra-zen's `launch`; `run` or `multirun` as its argument) is not the last thing
it does: then it waits, and handles a Ctrl-C itself, exiting with its own code (5)."""

import sys
import threading

import torch.distributed as dist
from hydra_zen import launch, make_config


def task(cfg: dict) -> int:
    dist.barrier()
    return dist.get_world_size()


if __name__ == "__main__":
    overrides = ["hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"]
    if sys.argv[1] == "multirun":
        sweep = launch(make_config(), task, overrides=[*overrides, "+x=1,2"], multirun=True, version_base="1.3")
        values = [job.return_value for job in sweep[0]]
    else:
        values = launch(make_config(), task, overrides=overrides, version_base="1.3").return_value
    try:
        print(f"done: {values}; waiting", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt as interrupt:
        print(f"the program had its Ctrl-C: {type(interrupt).__name__}", flush=True)
        sys.exit(5)
