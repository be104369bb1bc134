"""The work every benchmarked rank does, whoever started it, and the timestamps it leaves behind.

Each rank calls `run(mode, ...)` first thing in its task. It records `time.time()` at entry, makes sure
a gloo process group exists (hydra-ddpw has made one already; under torchrun, mp.spawn or submitit the
rank makes it here from what its launcher set), does the work of `mode`, and writes one JSON file of
timestamps to the folder named by the environment variable `BENCH_MARKS` (the benchmark driver sets it
and every launcher passes its environment on to the ranks). A group it made, it destroys at the end.

Modes:
  trivial    one all_reduce of a 1-element tensor, then a barrier (the job every launcher is timed on)
  fail       like trivial, but rank `fail_rank` writes its file and raises before the all_reduce
  allreduce  timed all_reduce of 1 MB and 64 MB float32 tensors (after warm-up)
  hold       like trivial, then every rank waits HOLD_S seconds (so the driver can look at the controller)
  ddp        wraps a small model in DistributedDataParallel and takes one training step (what every real
             job does first: it imports torch's DDP machinery), then like trivial
  train      like ddp, but TRAIN_STEPS steps: a small job of a research sweep, about a second of compute
  loop       a DDP training loop in steady state: LOOP_WARMUP steps, then LOOP_STEPS steps each timed on
             its own (a 3-layer MLP of LOOP_WIDTH units, batch LOOP_BATCH: about 10-30 ms a step with 2
             ranks on 2 cores), then like trivial

torch is imported inside the functions, so an app can keep its controller free of torch.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

MARKS_ENV = "BENCH_MARKS"
ALLREDUCE_SIZES_MB = (1, 64)
ALLREDUCE_WARMUP = 3
ALLREDUCE_ITERS = {1: 200, 64: 20}
HOLD_S = 1.0
TRAIN_STEPS = 300
LOOP_WARMUP = 20
LOOP_STEPS = 200
LOOP_INPUTS, LOOP_WIDTH, LOOP_CLASSES, LOOP_BATCH = 256, 1024, 10, 128


class RankAskedToFail(RuntimeError):
    """Raised by rank `fail_rank` in mode `fail`."""


def run(mode: str = "trivial", tag: str = "job0", fail_rank: int = 1) -> dict[str, Any]:
    """Do the work of `mode` on this rank and write its timestamps as `<tag>_rank<k>.json`; returns them."""
    entry = time.time()
    import torch
    import torch.distributed as dist

    made_here = not dist.is_initialized()
    rank, world = ensure_process_group()
    marks: dict[str, Any] = {"rank": rank, "world_size": world, "entry": entry, "ready": time.time(),
                             "pid": os.getpid(), "ppid": os.getppid()}
    if mode == "fail" and rank == fail_rank:
        marks["raise"] = time.time()
        write_marks(tag, rank, marks)
        raise RankAskedToFail(f"rank {rank} was asked to fail")
    if mode in ("ddp", "train"):
        marks["steps"] = train_ddp(1 if mode == "ddp" else TRAIN_STEPS)
    if mode == "loop":
        marks["step_s"] = time_training_steps()
        marks["loop"] = {"warmup": LOOP_WARMUP, "steps": LOOP_STEPS, "threads": torch.get_num_threads(),
                         "model": f"MLP {LOOP_INPUTS}-{LOOP_WIDTH}-{LOOP_WIDTH}-{LOOP_CLASSES}, batch {LOOP_BATCH}"}
    if mode == "allreduce":
        marks["allreduce_s"] = {str(mb): time_allreduce(mb) for mb in ALLREDUCE_SIZES_MB}
        marks["allreduce_warmup"] = ALLREDUCE_WARMUP
        marks["allreduce_iters"] = {str(mb): n for mb, n in ALLREDUCE_ITERS.items()}
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    marks["done"] = time.time()
    write_marks(tag, rank, marks)
    if mode == "hold":
        time.sleep(HOLD_S)
    if made_here:  # as torch asks of a script that made its group (hydra-ddpw destroys the one it made)
        dist.destroy_process_group()
    return marks


def train_ddp(steps: int) -> int:
    """`steps` steps of SGD on a small MLP wrapped in DistributedDataParallel (fixed seed and data)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(128, 64)
    for _ in range(steps):
        optimizer.zero_grad()
        model(data).square().mean().backward()
        optimizer.step()
    return steps


def time_training_steps() -> list[float]:
    """Seconds of each of LOOP_STEPS training steps (forward, backward with DDP's gradient all_reduce,
    optimizer step) of a 3-layer MLP wrapped in DistributedDataParallel, after LOOP_WARMUP untimed steps."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(LOOP_INPUTS, LOOP_WIDTH), torch.nn.ReLU(), torch.nn.Linear(LOOP_WIDTH, LOOP_WIDTH),
        torch.nn.ReLU(), torch.nn.Linear(LOOP_WIDTH, LOOP_CLASSES)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(LOOP_BATCH, LOOP_INPUTS), torch.randint(0, LOOP_CLASSES, (LOOP_BATCH,))
    times: list[float] = []
    for step in range(LOOP_WARMUP + LOOP_STEPS):
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        if step >= LOOP_WARMUP:
            times.append(time.perf_counter() - start)
    return times


def ensure_process_group() -> tuple[int, int]:
    """(rank, world size) of this process, after making its gloo process group if there is none yet."""
    import torch.distributed as dist

    if not dist.is_initialized():
        if "RANK" in os.environ and "MASTER_ADDR" in os.environ:  # torchrun, or set by the app (mp.spawn)
            dist.init_process_group("gloo")
        elif os.environ.get("SUBMITIT_EXECUTOR"):  # a task of a submitit job
            import submitit

            env = submitit.JobEnvironment()
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{_port_of(str(env.job_id))}",
                rank=env.global_rank, world_size=env.num_tasks,
            )
        else:  # a single process: a world of one
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def time_allreduce(size_mb: int) -> float:
    """Median seconds of one all_reduce of a `size_mb` MB float32 tensor, after warm-up."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32)
    for _ in range(ALLREDUCE_WARMUP):
        dist.all_reduce(tensor)
    times: list[float] = []
    for _ in range(ALLREDUCE_ITERS[size_mb]):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_marks(tag: str, rank: int, marks: dict[str, Any]) -> None:
    """Write `marks` atomically to `$BENCH_MARKS/<tag>_rank<rank>.json` (nothing when it is not set)."""
    folder: str | None = os.environ.get(MARKS_ENV)
    if not folder:
        return
    path = Path(folder) / f"{tag}_rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(marks))
    os.replace(tmp, path)


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_of(job_id: str) -> int:
    """A port every task of one submitit job agrees on, different across the jobs of a sweep."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return 20000 + int(digits) % 20000
