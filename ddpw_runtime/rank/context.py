"""What a task asks inside a rank: its rank, the world size, its groups, mesh and device."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ddpw_conf.layout import AXES
from ddpw_runtime.rank.environment import RESTART_COUNT_ENV

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from ddpw_conf import Platform
    from ddpw_runtime.launch.plan import LaunchPlan


@dataclass
class _RankState:
    plan: LaunchPlan
    rank: int
    local_rank: int
    device: torch.device
    group: Any | None
    mesh: DeviceMesh | None


_R = TypeVar("_R")
_state: _RankState | None = None


def enter(plan: LaunchPlan, rank: int, local_rank: int, device: torch.device, group: Any | None,
          mesh: DeviceMesh | None) -> None:
    """Record this rank's state (before the task starts)."""
    global _state
    _state = _RankState(plan, rank, local_rank, device, group, mesh)


def leave() -> None:
    """Forget this rank's state (after the task ends)."""
    global _state
    _state = None


def in_rank() -> bool:
    """Whether this process is a rank of a running job now (its task runs)."""
    return _state is not None


def _current() -> _RankState:
    if _state is None:
        inherited = os.environ.get("RANK")
        raise RuntimeError(
            "not inside a rank started by hydra-ddpw; call this from the task function while it runs (a Hydra job "
            "with a ddpw launcher, or a function started by Wrapper)" + (
                "" if inherited is None else
                f". This process has RANK={inherited} in its environment, as a process a rank started inherits it (a "
                "subprocess, a DataLoader worker of the 'spawn' start method): it is not the rank itself; read "
                "os.environ['RANK'], 'LOCAL_RANK' and 'WORLD_SIZE' there, or pass what it needs from the task"))
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


def run_id() -> str:
    """The running job's id, the same on every rank: SLURM's job id (kept when requeued), else a new random one."""
    return _current().plan.run_id


def restart_count() -> int:
    """How many times this job was started again (0 on its first run); usable outside a rank too."""
    return int(os.environ.get(RESTART_COUNT_ENV, "0"))


def platform() -> Platform:
    """The Platform of the running job."""
    return _current().plan.platform


def node_rank() -> int:
    """The index of this node in the job."""
    return _current().plan.node_rank


def device() -> torch.device:
    """The torch device this rank computes on (its own GPU on GPU platforms)."""
    return _current().device


def group(name: str | None = None) -> Any:
    """A process group of this rank: without a name, its group from `platform.ipc_groups`, or the world group; else
    its `"data"`, `"tensor"` or `"pipeline"` group of `platform.layout`. With the default layout the data group is the
    world and asking for a tensor or pipeline group raises ValueError. RuntimeError before the task made its process
    group (`platform.ipc_groups=null`)."""
    import torch.distributed as dist

    state = _current()
    if not dist.is_initialized():  # (platform.ipc_groups=null: the task makes the groups)
        raise RuntimeError("this rank has no process group yet: with platform.ipc_groups=null hydra-ddpw makes none "
                           "and the task makes its own; call torch.distributed.init_process_group() first, or leave "
                           "platform.ipc_groups unset for hydra-ddpw to make it before the task")
    if name is None:
        return state.group if state.group is not None else dist.group.WORLD
    if name not in AXES:
        raise ValueError(f"no group named {name!r}; the layout's groups are {', '.join(AXES)}")
    if state.mesh is not None:
        return state.mesh.get_group(name)
    if name == "data":
        return dist.group.WORLD
    raise ValueError(f"platform.layout.{name} is 1: every rank is data-parallel, so there is no {name} group; "
                     f"set platform.layout.{name} to split the world")


def mesh() -> DeviceMesh:
    """The DeviceMesh of `platform.layout`, axes ("pipeline", "data", "tensor"); `mesh()["tensor"]` is this rank's
    tensor-parallel sub-mesh. Built only when tensor or pipeline is above 1, else RuntimeError (build a 1-D mesh with
    `init_device_mesh(device().type, (world_size(),))` if needed)."""
    built = _current().mesh
    if built is None:
        raise RuntimeError("this job has no layout mesh: platform.layout has tensor=1 and pipeline=1 (every rank "
                           "data-parallel); set platform.layout.tensor or platform.layout.pipeline above 1")
    return built


def is_main() -> bool:
    """Whether this is global rank 0."""
    return rank() == 0


def rank_zero_only(fn: Callable[..., _R]) -> Callable[..., _R | None]:
    """Decorator: `fn` runs on global rank 0 only (and outside a rank), returning None on every other rank. Never put
    a collective inside `fn`: the other ranks would wait for it forever."""

    @functools.wraps(fn)
    def on_rank_zero(*args: Any, **kwargs: Any) -> _R | None:
        if _state is not None and _state.rank != 0:
            return None
        return fn(*args, **kwargs)

    return on_rank_zero


def barrier() -> None:
    """Wait until every rank of the world reaches this point."""
    import torch.distributed as dist

    _current()
    dist.barrier()
