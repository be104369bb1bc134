"""Train a small MLP on scikit-learn's digits with DistributedDataParallel, one Hydra job per run.

    python examples/train.py                                       # 2 CPU ranks
    python examples/train.py platform.n_procs_per_node=4
    python examples/train.py -m lr=0.1,0.01 platform.n_procs_per_node=1,2
    python examples/train.py hydra/launcher=ddpw_gpu platform.n_gpus_per_node=4

Returns the validation accuracy (rank 0's value is the job's return value).
"""

import logging
from typing import Any

import hydra
import torch
import torch.distributed as dist
from digits_data import digits_split, mlp
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ddpw_runtime

log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    """Train for `cfg.epochs` epochs; returns the validation accuracy."""
    device = ddpw_runtime.device()
    train_set, val_set = digits_split()
    val_x, val_y = (t.to(device) for t in val_set.tensors)
    sampler: DistributedSampler[Any] = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    model = mlp(cfg.hidden).to(device)
    model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimiser.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimiser.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(len(y), device=device)])
        dist.all_reduce(total)
        with torch.no_grad():
            accuracy = (model(val_x).argmax(dim=1) == val_y).float().mean().item()
        if ddpw_runtime.is_main():
            log.info(f"epoch {epoch + 1:3d}  loss {total[0] / total[1]:.4f}  val_acc {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    train()
