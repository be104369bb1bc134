"""PyTorch Lightning inside a ddpw job: ddpw starts the ranks, Lightning's Trainer joins them.

    python examples/lightning_train.py                        # 2 CPU ranks (examples/conf/config.yaml)
    python examples/lightning_train.py hydra/launcher=ddpw_gpu platform.n_gpus_per_node=4

Each rank has torchrun's environment, so `Trainer(strategy="ddp")` detects an already launched job
(TorchElasticEnvironment), uses the process group ddpw initialised and starts no process of its own.
Give it the platform's layout: `devices` = ranks per node, `num_nodes` = nodes. Returns the validation
accuracy (rank 0's value is the job's return value).
"""


import hydra
import lightning as L
import torch
from digits_data import digits_split, mlp
from omegaconf import DictConfig
from torch.utils.data import DataLoader

import ddpw_runtime


class DigitsClassifier(L.LightningModule):
    """The digits MLP as a LightningModule."""

    def __init__(self, hidden: int, lr: float) -> None:
        super().__init__()
        self.net = mlp(hidden)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores for a batch of images."""
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Cross-entropy of one batch."""
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def trainer(max_epochs: int) -> L.Trainer:
    """A Trainer for the ranks of this job: one device per rank, DDP over ddpw's process group."""
    platform = ddpw_runtime.platform()
    return L.Trainer(
        accelerator="gpu" if ddpw_runtime.device().type == "cuda" else "cpu",
        devices=platform.ranks_per_node,
        num_nodes=platform.n_nodes,
        strategy="ddp",
        max_epochs=max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def fit(cfg: DictConfig) -> tuple[L.Trainer, DigitsClassifier, float]:
    """Train for `cfg.epochs` epochs; the trainer, the model and its validation accuracy."""
    train_set, val_set = digits_split()
    val_x, val_y = val_set.tensors
    model = DigitsClassifier(cfg.hidden, cfg.lr)
    fitter = trainer(cfg.epochs)
    # Lightning gives each rank its shard (it adds a DistributedSampler to this loader).
    fitter.fit(model, DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True))
    with torch.no_grad():
        predicted = model(val_x.to(model.device)).argmax(dim=1)
    accuracy = (predicted == val_y.to(model.device)).float().mean().item()
    return fitter, model, accuracy


@hydra.main(version_base=None, config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    """Train; returns the validation accuracy."""
    fitter, _, accuracy = fit(cfg)
    if fitter.is_global_zero:
        print(f"{fitter.world_size} ranks, {fitter.global_step} steps, val_acc {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    train()
