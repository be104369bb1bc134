"""The GPU benchmark's Hydra app: one rank per GPU, nccl, and a training loop on the GPU.

    python gpu_app.py                        # hydra-ddpw, a plain run (rank 0 is the program's own run)
    python gpu_app.py -m                     # hydra-ddpw, a multirun of one job
    torchrun --nproc_per_node=1 gpu_app.py hydra/launcher=basic

Each rank prints `step_ms=<median milliseconds per training step>` and `ready_s=<seconds from the
program's start to the task's first line>` (the program's start comes in `BENCH_T0`).
"""

import os
import statistics
import time

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig

WIDTH, BATCH, WARMUP, STEPS = 4096, 4096, 20, 200


@hydra.main(version_base=None, config_path="conf", config_name="gpu")
def main(cfg: DictConfig) -> float:
    ready = time.time() - float(os.environ.get("BENCH_T0", time.time()))
    made_here = not dist.is_initialized()
    if made_here:  # under torchrun: the rank makes its own group
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    device = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10)).to(device), device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(BATCH, WIDTH, device=device), torch.randint(0, 10, (BATCH,), device=device)
    times = []
    for step in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
        torch.cuda.synchronize()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    step_ms = statistics.median(times) * 1000
    if dist.get_rank() == 0:
        print(f"step_ms={step_ms:.3f} ready_s={ready:.3f} backend={dist.get_backend()}", flush=True)
    if made_here:
        dist.destroy_process_group()
    return step_ms


if __name__ == "__main__":
    main()
