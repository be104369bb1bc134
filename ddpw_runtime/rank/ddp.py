"""Model helpers inside a rank: wrap a model for DistributedDataParallel, unwrap it, skip gradient sync while
accumulating. torch is imported inside the functions, so importing `ddpw_runtime` stays cheap."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from ddpw_runtime import _compat
from ddpw_runtime.rank import context

if TYPE_CHECKING:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel


def wrap_model(model: nn.Module, *, sync_batchnorm: bool = False, **ddp_options: Any) -> DistributedDataParallel:
    """`model` moved to this rank's device and wrapped in DistributedDataParallel over `group("data")`, with
    `find_unused_parameters` False unless given (it costs a graph walk per step) and `device_ids` set on CUDA; other
    keywords go to DistributedDataParallel as is. `sync_batchnorm=True` converts BatchNorm layers to SyncBatchNorm
    first (CUDA ranks only, else ValueError). Call it on every rank: it broadcasts rank 0's weights."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    device = context.device()
    data_group = ddp_options.pop("process_group", context.group("data"))
    if sync_batchnorm:
        if device.type != "cuda":
            raise ValueError(f"sync_batchnorm=True needs CUDA ranks (torch's SyncBatchNorm runs on GPUs only) and this "
                             f"rank computes on {device.type}; leave sync_batchnorm False, or use platform.device=gpu")
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=data_group)
    model = model.to(device)
    ddp_options.setdefault("find_unused_parameters", False)
    if device.type == "cuda":
        ddp_options.setdefault("device_ids", [device])
    return DistributedDataParallel(model, process_group=data_group, **ddp_options)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside `model`'s DistributedDataParallel, DataParallel and `torch.compile` wrappers, however
    nested: save and load state dicts on it, so the keys carry no `module.` prefix."""
    from torch import nn

    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif (original := _compat.compiled_original(model)) is not None:
            model = original
        else:
            return model


def no_sync(model: nn.Module, skip: bool = True) -> AbstractContextManager[None]:
    """A context in which backward passes of a DDP `model` accumulate gradients without the all-reduce; the first
    backward outside it synchronises everything accumulated. Over `k` micro-batches, skip all but the last::

        for i, (x, y) in enumerate(loader):
            with ddpw_runtime.no_sync(model, skip=(i + 1) % k != 0):
                (loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                optimiser.step()
                optimiser.zero_grad()

    With `skip=False`, or a model that is not DDP-wrapped, this is a no-op context.
    """
    from torch.nn.parallel import DistributedDataParallel

    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return nullcontext()
