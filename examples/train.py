"""Train a small MLP on scikit-learn's digits with DistributedDataParallel, one Hydra job per run.

    python examples/train.py                                       # 2 CPU ranks
    python examples/train.py platform.n_procs_per_node=4
    python examples/train.py -m lr=0.1,0.01 platform.n_procs_per_node=1,2
    python examples/train.py hydra/launcher=ddpw_gpu platform.n_gpus_per_node=4

Returns the validation accuracy (rank 0's value is the job's return value).
"""

import logging

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ddpw_runtime

log = logging.getLogger(__name__)


def digits(device: torch.device) -> tuple:
    """The digits data set as (train, validation) tensor data sets; the same split on every rank."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return TensorDataset(x[:split], y[:split]), (x[split:].to(device), y[split:].to(device))


@hydra.main(version_base=None, config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    """Train for `cfg.epochs` epochs; returns the validation accuracy."""
    device = ddpw_runtime.device()
    train_set, (val_x, val_y) = digits(device)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 10)).to(device)
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
