"""The torch side of a rank: threads, device, process group, groups, layout mesh, seeds, and its undoing; for ranks in
processes of their own (`procs/rank.py`) and in the caller's process (`procs/caller.py`)."""

from __future__ import annotations

import contextlib
import random
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddpw_runtime import _compat
from ddpw_runtime.launch.plan import LaunchPlan
from ddpw_runtime.rank import context
from ddpw_runtime.rank.environment import threads_per_rank
from ddpw_runtime.rank.task_init import JobGroup, answer_task_init, restore_init, watch_own_rendezvous, watch_spawns

# The job's store while this process is a rank: a task that makes its own group finds it through `env://`.
_held_store: Any = None


def setup_rank(plan: LaunchPlan, rank: int, local_rank: int) -> None:
    """Make this process `rank` of `plan`'s job (undo with `teardown_rank`), joining the job's store, which the
    supervising process serves (`LocalJob.host_store`; also with `ipc_groups=null`, for `env://`)."""
    global _held_store
    torch.set_num_threads(threads_per_rank(plan))
    gpu = torch.device("cuda", local_rank) if plan.device == "cuda" else None
    if gpu is not None:
        torch.cuda.set_device(gpu)
    timeout = timedelta(minutes=plan.platform.collective_timeout_min)
    own_group: Any | None = None
    mesh: DeviceMesh | None = None
    if plan.makes_group or plan.init_method.startswith("tcp://"):
        _held_store = _store(plan, timeout)
    if plan.makes_group:
        dist.init_process_group(backend=plan.backend, store=_held_store, rank=rank, world_size=plan.world_size,
                                timeout=timeout, device_id=gpu)
        for members in plan.groups:
            group = dist.new_group(members, timeout=timeout)  # (else torch's default, 30 minutes)
            if rank in members:
                own_group = group
        layout = plan.platform.layout
        if not layout.is_data_only:  # else the world group is the data group: no mesh (see `context.group`)
            sizes = layout.sizes(plan.world_size)
            # The groups of an axis narrower than the world get the job's timeout (else torch's default, 30 minutes);
            # an axis as wide as the world is the world group, and has it.
            options = _compat.mesh_group_options(plan.backend, timeout)
            narrower: dict[int | str, Any] = {axis: options for axis, size in sizes.items() if size < plan.world_size}
            mesh = init_device_mesh(plan.device, tuple(sizes.values()), mesh_dim_names=tuple(sizes),
                                    backend_override=narrower if options is not None and narrower else None)
        # Every rank waits until all have their groups: else a rank whose task ends at once tears its group down
        # while a slower peer still connects, which fails with gloo's "Connection closed by peer". No device used.
        _count_in(_held_store, "joined", plan.world_size)
        answer_task_init(JobGroup(plan, rank, timeout, gpu, dist.group.WORLD))
    else:
        watch_own_rendezvous(plan, rank)
    watch_spawns(plan, rank)
    context.enter(plan, rank, local_rank, gpu or torch.device(plan.device), own_group, mesh)
    random.seed(plan.platform.seed)
    # Only the job's devices: `torch.manual_seed` would also queue seeds for CUDA, XPU and MTIA where they are not
    # started, formatting the stack for each (~2 ms in a new rank).
    torch.random.default_generator.manual_seed(plan.platform.seed)
    if gpu is not None:
        torch.cuda.manual_seed_all(plan.platform.seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(plan.platform.seed)


def _count_in(store: Any, step: str, world_size: int) -> None:
    """Count this rank as past `step` on `store`, and wait until all `world_size` ranks are."""
    if store.add(f"ddpw/{step}", 1) == world_size:
        store.set(f"ddpw/all_{step}", "1")
    store.wait([f"ddpw/all_{step}"])


def _store(plan: LaunchPlan, timeout: timedelta) -> Any:
    """The job's store: a private file, or the TCPStore the supervising process serves."""
    if plan.init_method.startswith("file://"):
        return dist.FileStore(plan.init_method.removeprefix("file://"), plan.world_size)
    return dist.TCPStore(plan.master_addr, plan.master_port, plan.world_size, is_master=False, timeout=timeout,
                         wait_for_workers=False)


def warm_up() -> None:
    """Import once, in the rank starter, what each rank would import to seed: numpy's random (torch loads not it)."""
    with contextlib.suppress(ImportError):
        import numpy.random  # noqa: F401


def teardown_rank() -> None:
    """Destroy the process group (if the task did not), drop the store and clear `context`, for another job."""
    global _held_store
    restore_init()
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        _compat.forget_failed_process_group()
    _held_store = None
    context.leave()
