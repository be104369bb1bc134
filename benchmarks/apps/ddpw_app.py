"""The `ddpw` package's Wrapper with N ranks on CPU: `python ddpw_app.py N [MODE] [fork]`.

ddpw 5.3 runs a single process for `device='cpu'` and as many ranks as there are CUDA GPUs for
`device='gpu'`. On a machine without GPUs, the GPU path is used with `torch.cuda.device_count`
reporting N as ddpw sees it; ddpw's rank setup touches no CUDA API there (gloo, seeding only), so this
times ddpw's own way of starting ranks (torch.multiprocessing `fork` by default).

With `fork`, the script first forks a child that exits at once, and waits for it: the least that any way of
running a rank in a process of its own adds to ddpw's one-rank job, which runs in this process. After a fork,
this process's memory is copy-on-write, so its own exit then faults on every page it writes.
"""

import os
import sys

import ddpw.platform
import rank_work
import torch  # noqa: F401 - imported at the top, as a training script does
from ddpw import Platform, Wrapper


def task(global_rank: int, local_rank: int, group: object, args: tuple) -> None:
    """ddpw's task signature; the benchmark work."""
    rank_work.run(*args)


if __name__ == "__main__":
    n = int(sys.argv[1])
    ddpw.platform.device_count = lambda: n  # what ddpw asks to decide how many ranks to start
    platform = Platform(device="gpu", n_gpus=n, master_port=str(rank_work.free_port()), verbose=False)
    if sys.argv[3:] == ["fork"]:
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
    Wrapper(platform).start(task, (sys.argv[2] if len(sys.argv) > 2 else "trivial",))
