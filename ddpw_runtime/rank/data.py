"""Data helpers inside a rank: a distributed sampler for a dataset, and moving a batch to the device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpw_runtime.rank import context

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset, DistributedSampler


def distributed_sampler(dataset: Dataset, *, shuffle: bool = True, seed: int | None = None,
                        drop_last: bool = False) -> DistributedSampler:
    """A DistributedSampler giving this rank its share of `dataset` among the data-parallel replicas.

    Replicas are the ranks of `group("data")` (the whole world unless `platform.layout` splits it): the
    ranks of one tensor- or pipeline-parallel group get the same samples. `seed` defaults to
    `platform.seed`, and must be the same on every rank so the shards do not overlap.

    Call `sampler.set_epoch(epoch)` at the start of every epoch: without it the shuffled order is the
    same in every epoch. Pass it to a DataLoader as `sampler=` (not together with `shuffle=True`).
    Without `drop_last`, the last samples are repeated so every replica gets as many batches.
    """
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    data_group = context.group("data")
    seed = context.platform().seed if seed is None else seed
    return DistributedSampler(dataset, num_replicas=dist.get_world_size(data_group), rank=dist.get_rank(data_group),
                              shuffle=shuffle, seed=seed, drop_last=drop_last)


def to_device(batch: Any, device: torch.device | None = None, non_blocking: bool = False) -> Any:
    """`batch` with every tensor moved to `device` (default: this rank's device), through nested tuples,
    named tuples, lists and dicts; everything else is returned as it is."""
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
