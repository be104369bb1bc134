"""scikit-learn's digits (8x8 images, 10 classes) as torch tensors, for the examples: the same split on
every rank."""


import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset


def digits_split() -> tuple[TensorDataset, TensorDataset]:
    """(train, validation) data sets: 80% / 20% of the digits, shuffled with a fixed seed."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


def mlp(hidden: int) -> nn.Module:
    """A one-hidden-layer classifier for the 64 pixels."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
