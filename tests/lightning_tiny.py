"""A one-layer LightningModule with a step for every stage, and its data, at module level: ddp_spawn
pickles the model for its processes by reference. Imported inside the tests that use it (Lightning
imports slowly)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class Tiny(L.LightningModule):
    """`Linear(2, 1)`; trains on the sum of its output, logs it as `val` and `test`, predicts it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, index: int) -> Any:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, index: int) -> None:
        self.log("val", self.layer(batch[0]).sum())

    def test_step(self, batch: Any, index: int) -> None:
        self.log("test", self.layer(batch[0]).sum())

    def predict_step(self, batch: Any, index: int) -> Any:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def samples() -> torch.utils.data.DataLoader:
    """8 random samples in batches of 4."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
