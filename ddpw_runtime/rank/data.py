"""Data helpers inside a rank: a distributed sampler for a dataset, and moving a batch to the device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpw_runtime.rank import context

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset, DistributedSampler


def distributed_sampler(dataset: Dataset, *, shuffle: bool = True, seed: int | None = None,
                        drop_last: bool = False) -> DistributedSampler:
    """A DistributedSampler giving this rank its share of `dataset` among the ranks of `group("data")` (a tensor- or
    pipeline-parallel group's ranks get the same samples). `seed` defaults to `platform.seed` and must be the same
    on every rank. Call `sampler.set_epoch(epoch)` every epoch (else the order repeats), and pass it to a DataLoader
    as `sampler=` (without `shuffle=True`). Without `drop_last`, the last samples repeat so all get as many batches.
    """
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    data_group = context.group("data")
    seed = context.platform().seed if seed is None else seed
    return DistributedSampler(dataset, num_replicas=dist.get_world_size(data_group), rank=dist.get_rank(data_group),
                              shuffle=shuffle, seed=seed, drop_last=drop_last)


def to_device(batch: Any, device: torch.device | None = None, non_blocking: bool = False) -> Any:
    """`batch` with every tensor moved to `device` (default: this rank's), through nested tuples, lists and dicts."""
    import torch

    target = context.device() if device is None else device

    def move(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.to(target, non_blocking=non_blocking)
        if isinstance(item, dict):
            return type(item)((key, move(value)) for key, value in item.items())
        if isinstance(item, tuple) and hasattr(item, "_fields"):
            return type(item)(*(move(value) for value in item))
        if isinstance(item, (list, tuple)):
            return type(item)(move(value) for value in item)
        return item

    return move(batch)
