"""torch.multiprocessing.spawn of N ranks: `python mp_spawn_app.py N [MODE]`."""

import os
import sys

import rank_work
import torch
import torch.multiprocessing as mp


def rank_main(rank: int, world_size: int, port: int, mode: str) -> None:
    """One rank: the environment torchrun would set, then the benchmark work."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    rank_work.run(mode)


if __name__ == "__main__":
    n = int(sys.argv[1])
    mp.spawn(rank_main, args=(n, rank_work.free_port(), sys.argv[2] if len(sys.argv) > 2 else "trivial"), nprocs=n)
