"""What a task asks inside a rank: its rank, the world size, its group and device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

    from ddpw_runtime.plan import LaunchPlan


@dataclass
class _RankState:
    plan: "LaunchPlan"
    rank: int
    local_rank: int
    device: "torch.device"
    group: Optional[Any]


_state: Optional[_RankState] = None


def enter(plan: "LaunchPlan", rank: int, local_rank: int, device: "torch.device", group: Optional[Any]) -> None:
    """Record the state of this rank (called by the runtime before the task starts)."""
    global _state
    _state = _RankState(plan, rank, local_rank, device, group)


def leave() -> None:
    """Forget the state of this rank (called by the runtime after the task ends)."""
    global _state
    _state = None


def _current() -> _RankState:
    if _state is None:
        raise RuntimeError(
            "not inside a rank started by hydra-ddpw; call this from the task function "
            "(a Hydra job with a ddpw launcher, or a function started by Wrapper)"
        )
    return _state


def rank() -> int:
    """The global rank of this process."""
    return _current().rank


def local_rank() -> int:
    """The rank of this process on its node."""
    return _current().local_rank


def world_size() -> int:
    """The number of ranks in the job."""
    return _current().plan.world_size


def node_rank() -> int:
    """The index of this node in the job."""
    return _current().plan.node_rank


def device() -> "torch.device":
    """The torch device this rank computes on (its own GPU on GPU platforms)."""
    return _current().device


def group() -> Any:
    """This rank's process group from `platform.ipc_groups`, or the default (world) group."""
    import torch.distributed as dist

    own = _current().group
    return own if own is not None else dist.group.WORLD


def is_main() -> bool:
    """Whether this is global rank 0."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank of the world reaches this point."""
    import torch.distributed as dist

    _current()
    dist.barrier()
