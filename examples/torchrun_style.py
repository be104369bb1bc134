"""A training script written for torchrun, run by ddpw with its distributed code unchanged.

    torchrun --nproc-per-node 2 script.py   ->   python examples/torchrun_style.py

What such scripts assume holds in every rank: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...
are set as torchrun sets them, and its own `init_process_group(...)` and `destroy_process_group()`
work: the call joins the group hydra-ddpw made for the job (or, with `platform.ipc_groups=null`, makes
it, as under torchrun). See docs/from-torchrun.md.

Returns the validation accuracy (rank 0's value is the job's return value).
"""

import os
from typing import Any

import hydra
import torch
import torch.distributed as dist
from digits_data import digits_split, mlp
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def fit(cfg: DictConfig) -> float:
    """Train for `cfg.epochs` epochs the torchrun way; returns the validation accuracy."""
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    train_set, val_set = digits_split()
    # The sampler reads the rank and world size from the process group.
    sampler: DistributedSampler[Any] = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    device_ids = [local_rank] if device.type == "cuda" else None
    model = DistributedDataParallel(mlp(cfg.hidden).to(device), device_ids=device_ids)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimiser.step()
    val_x, val_y = (t.to(device) for t in val_set.tensors)
    with torch.no_grad():
        return (model(val_x).argmax(dim=1) == val_y).float().mean().item()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    """Train; returns the validation accuracy."""
    accuracy = fit(cfg)
    if int(os.environ["RANK"]) == 0:
        print(f"world size {os.environ['WORLD_SIZE']}, val_acc {accuracy:.4f}")
    dist.destroy_process_group()
    return accuracy


if __name__ == "__main__":
    train()
