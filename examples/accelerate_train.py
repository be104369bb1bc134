"""Hugging Face accelerate inside a ddpw job: ddpw starts the ranks, `Accelerator()` joins them.

    python examples/accelerate_train.py                       # 2 CPU ranks (examples/conf/config.yaml)
    python examples/accelerate_train.py hydra/launcher=ddpw_gpu platform.n_gpus_per_node=4

Each rank has the environment `accelerate launch` would give it (torchrun's variables, plus
`ACCELERATE_USE_CPU` on CPU platforms), so `Accelerator()` sees every rank, uses the process group
ddpw initialised, and `prepare` / `backward` / `gather_for_metrics` work as under `accelerate launch`.
Returns the validation accuracy (rank 0's value is the job's return value).
"""


import hydra
import torch
from accelerate import Accelerator
from digits_data import digits_split, mlp
from omegaconf import DictConfig
from torch.utils.data import DataLoader


def fit(cfg: DictConfig) -> tuple[Accelerator, float]:
    """Train for `cfg.epochs` epochs; the accelerator and the validation accuracy (every rank's
    predictions gathered)."""
    accelerator = Accelerator()
    train_set, val_set = digits_split()
    model = mlp(cfg.hidden)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)
    # prepare() wraps the model in DDP and shards both loaders across the ranks.
    model, optimiser, train_loader, val_loader = accelerator.prepare(model, optimiser, train_loader, val_loader)
    for _ in range(cfg.epochs):
        model.train()
        for x, y in train_loader:
            optimiser.zero_grad()
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimiser.step()
    model.eval()
    correct = []
    with torch.no_grad():
        for x, y in val_loader:
            correct.append(accelerator.gather_for_metrics(model(x).argmax(dim=1) == y))
    return accelerator, torch.cat(correct).float().mean().item()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    """Train; returns the validation accuracy."""
    accelerator, accuracy = fit(cfg)
    accelerator.print(f"{accelerator.num_processes} processes, val_acc {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    train()
