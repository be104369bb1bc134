"""Collectives a task needs by hand: the mean of a metric over ranks, and all-to-all of tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ddpw_runtime.rank import context

if TYPE_CHECKING:
    import torch


def average(value: float | torch.Tensor, group: Any | None = None) -> float | torch.Tensor:
    """The mean of `value` over the ranks of `group` (default: the world), on every rank: a float for a number, a
    tensor of the same shape for a tensor (element-wise, in floating point; the input is unchanged). Every rank of
    the group must call it."""
    import torch
    import torch.distributed as dist

    tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float64)
    tensor = tensor.to(context.device(), copy=True)
    if not tensor.is_floating_point():
        tensor = tensor.double()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    tensor /= dist.get_world_size(group)
    return tensor.to(value.device) if isinstance(value, torch.Tensor) else tensor.item()


def all_to_all(tensors: Sequence[torch.Tensor], group: Any | None = None) -> list[torch.Tensor]:
    """Send `tensors[i]` to the i-th rank of `group` (default: the world); returns the tensors received, the j-th from
    the j-th rank, on this rank's device. Shapes may differ between pairs; dtype and number of dimensions may not."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if len(tensors) != size:
        raise ValueError(f"all_to_all needs one tensor per rank of the group ({size}), got {len(tensors)}")
    device = context.device()
    sending = [t.to(device).contiguous() for t in tensors]
    shapes: list[tuple] = [() for _ in sending]  # each rank's shape of what it sends here, exchanged first
    if sending[0].dim() > 0:
        shapes_in = torch.empty((size, sending[0].dim()), dtype=torch.int64, device=device)
        dist.all_to_all_single(shapes_in, torch.tensor([list(t.shape) for t in sending], device=device), group=group)
        shapes = [tuple(shape.tolist()) for shape in shapes_in]
    sizes = [math.prod(shape) for shape in shapes]
    received = torch.empty(sum(sizes), dtype=sending[0].dtype, device=device)
    dist.all_to_all_single(received, torch.cat([t.flatten() for t in sending]), output_split_sizes=sizes,
                           input_split_sizes=[t.numel() for t in sending], group=group)
    return [piece.reshape(shape) for piece, shape in zip(received.split(sizes), shapes, strict=True)]

