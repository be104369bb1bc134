"""A program whose plain run (hydra-zen's `launch`) is not the last thing it does: then it waits, and handles a
Ctrl-C itself, exiting with its own code (5)."""

import sys
import threading

import torch.distributed as dist
from hydra_zen import launch, make_config


def task(cfg: dict) -> int:
    dist.barrier()
    return dist.get_world_size()


if __name__ == "__main__":
    job = launch(make_config(), task, overrides=["hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"],
                 version_base="1.3")
    try:
        print(f"run done: {job.return_value}; waiting", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("the program had its Ctrl-C", flush=True)
        sys.exit(5)
