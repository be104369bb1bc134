"""Gradient accumulation with `ddpw_runtime.no_sync`, checked against one process with the whole batch.

Two ranks each run `accumulation` micro-batches of `micro_batch` samples per optimiser step, syncing
gradients only on the last micro-batch: an effective batch of 2 x accumulation x micro_batch. One
process with that batch size, no accumulation, must end with the same parameters (up to float
rounding), and this script prints how far apart they are.

    python examples/grad_accumulation.py
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

SAMPLES = 1024
"""Digits used (a multiple of every effective batch below, so no rank gets padded samples)."""


def digits() -> TensorDataset:
    """The first `SAMPLES` digits of scikit-learn's bundled data set, scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    return TensorDataset(torch.tensor(x[:SAMPLES] / 16.0, dtype=torch.float32), torch.tensor(y[:SAMPLES]))


def train(micro_batch: int, accumulation: int, epochs: int) -> torch.Tensor:
    """Train an MLP with SGD; every optimiser step averages the gradient over `accumulation`
    micro-batches on each rank. Returns the final parameters, flattened."""
    data = digits()
    sampler = ddpw_runtime.distributed_sampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=micro_batch, sampler=sampler)
    model = ddpw_runtime.wrap_model(nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for step, batch in enumerate(loader):
            x, y = ddpw_runtime.to_device(batch)
            last_micro_batch = (step + 1) % accumulation == 0
            with ddpw_runtime.no_sync(model, skip=not last_micro_batch):
                (loss_fn(model(x), y) / accumulation).backward()
            if last_micro_batch:
                optimiser.step()
                optimiser.zero_grad()
    return torch.cat([p.detach().flatten() for p in ddpw_runtime.unwrap_model(model).parameters()])


def compare(
    micro_batch: int = 8, accumulation: int = 4, epochs: int = 2, log_dir: str = "ddpw_logs/grad_accumulation"
) -> tuple:
    """Parameters after (2 ranks, accumulation) and after (1 process, the equivalent batch size)."""
    ranks = 2
    accumulated = Wrapper(Platform(n_procs_per_node=ranks), log_dir=f"{log_dir}/accumulated").start(
        train, micro_batch, accumulation, epochs
    )
    whole = Wrapper(Platform(n_procs_per_node=1), log_dir=f"{log_dir}/whole_batch").start(
        train, ranks * accumulation * micro_batch, 1, epochs
    )
    return accumulated[0], whole[0]


if __name__ == "__main__":
    accumulated, whole = compare()
    gap = (accumulated - whole).abs().max().item()
    print(f"largest parameter difference: {gap:.2e} (mean |parameter|: {whole.abs().mean().item():.2f})")
    print("same parameters" if torch.allclose(accumulated, whole, atol=1e-5, rtol=1e-4) else "DIFFERENT parameters")
