"""What runs in each rank process: environment, log file, Hydra state, device, process group, seed,
then the task; always ends by writing a `RankResult`.

Run as `python -m ddpw_runtime.rank_process PAYLOAD LOCAL_RANK` (spawn) or called from the starter after fork.
`setup_rank` and `teardown_rank` (the torch side of a rank) are shared with the rank that runs in the
caller (`caller_rank.py`).
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddpw_runtime import context
from ddpw_runtime.client_libraries import library_environment, tell_imported_libraries
from ddpw_runtime.payload import RankPayload, read_payload, write_atomically
from ddpw_runtime.plan import LaunchPlan
from ddpw_runtime.results import RankResult


def main(payload_path: str, local_rank: int, listen_fd: Optional[int] = None) -> int:
    """Run one rank; returns the process exit code (0: the task returned, 1: it raised).
    `listen_fd` is the rendezvous socket the controller bound, given to the rank that hosts the store."""
    # SIGTERM stops a rank unless its task installs a handler, even where the starter ignores it (on a
    # SLURM node, where SLURM signals every process of the job).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    payload = read_payload(Path(payload_path))
    plan = payload.plan
    rank = plan.node_rank * plan.ranks_per_node + local_rank
    _redirect_output(plan.log_file(rank))
    try:
        _enter_caller_state(payload, rank, local_rank)
        target, args, kwargs = cloudpickle.loads(payload.task)
        setup_rank(plan, rank, local_rank, listen_fd)
        value = target(*args, **kwargs)
        result = RankResult.success(rank, value)
    except SystemExit as exc:
        result = _exit_result(rank, exc)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the controller
        sys.stderr.write(f"[rank {rank}] failed:\n")
        exc = from_task(exc, main)
        traceback.print_exception(exc)
        result = RankResult.failure(rank, exc)
    # The result is on disk before this rank's connections close, so when its peers fail on the
    # closed connection, the controller already knows this rank failed first.
    write_atomically(payload.result_file(rank), cloudpickle.dumps(result))
    if result.ok:  # a failed rank just exits; its peers are stopped by the controller
        teardown_rank()
    sys.stdout.flush()
    sys.stderr.flush()
    return 0 if result.ok else 1


def _exit_result(rank: int, exc: SystemExit) -> RankResult:
    """`sys.exit()` in a task: success for status 0 or None, else a failure naming the status."""
    if exc.code in (0, None):
        return RankResult.success(rank, None)
    return RankResult.failure(rank, exc)


def from_task(exc: BaseException, runner: Any) -> BaseException:
    """`exc` with the frame of `runner` (the function that called the task) dropped from its
    traceback, so the traceback starts at the task, not at the runtime."""
    if exc.__traceback__ is not None and exc.__traceback__.tb_frame.f_code is runner.__code__:
        return exc.with_traceback(exc.__traceback__.tb_next)
    return exc


def _redirect_output(log_file: Path) -> None:
    """Send fds 1 and 2 (Python and C/C++ output alike) to the rank's log file."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    faulthandler.enable(file=sys.stderr)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stack dump on request


def _enter_caller_state(payload: RankPayload, rank: int, local_rank: int) -> None:
    """Take on the controller's environment, cwd, import path and Hydra state, plus the rank's own
    variables (as torchrun sets them)."""
    plan = payload.plan
    os.environ.clear()
    os.environ.update(payload.env)
    os.environ.update(rank_environment(plan, rank, local_rank))
    tell_imported_libraries(rank)
    os.chdir(payload.cwd)
    sys.path[:] = payload.sys_path
    if payload.hydra_state is not None:
        _restore_hydra(payload.hydra_state, rank)


def rank_environment(plan: LaunchPlan, rank: int, local_rank: int) -> dict:
    """The variables torchrun sets for a rank, so libraries inside the task see a launched job; on a
    single-node job over loopback, gloo and NCCL are kept on the loopback interface too (unless the
    user chose an interface); plus what Lightning and accelerate look for (`client_libraries`)."""
    local_only = plan.platform.n_nodes == 1 and plan.master_addr.startswith("127.") and sys.platform == "linux"
    interfaces = {
        name: "lo" for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if local_only and name not in os.environ
    }
    return {
        **interfaces,
        **library_environment(plan.device),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.ranks_per_node),
        "GROUP_RANK": str(plan.node_rank),
        "NODE_RANK": str(plan.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "ROLE_NAME": "default",
        "GROUP_WORLD_SIZE": str(plan.platform.n_nodes),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "TORCHELASTIC_RUN_ID": plan.run_id,
        "TORCHELASTIC_RESTART_COUNT": os.environ.get(context.RESTART_COUNT_ENV, "0"),
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": str(plan.threads_per_rank),
    }


def _restore_hydra(state: bytes, rank: int) -> None:
    """Restore HydraConfig and resolvers, then the job logging (file handlers on rank 0 only, so the
    job log gets each line once)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log
    from omegaconf import OmegaConf

    from ddpw_runtime import hydra_state

    hydra_state.restore(state)
    hydra_cfg = HydraConfig.get()
    logging_cfg = OmegaConf.to_container(hydra_cfg.job_logging, resolve=True) if hydra_cfg.job_logging else None
    if isinstance(logging_cfg, dict) and rank != 0:
        handlers = logging_cfg.get("handlers", {})
        files = [name for name, h in handlers.items() if "FileHandler" in str(h.get("class", ""))]
        for name in files:
            del handlers[name]
        for logger in [logging_cfg.get("root", {}), *logging_cfg.get("loggers", {}).values()]:
            if isinstance(logger, dict) and "handlers" in logger:
                logger["handlers"] = [h for h in logger["handlers"] if h not in files]
    configure_log(OmegaConf.create(logging_cfg) if logging_cfg else None, hydra_cfg.verbose)


def setup_rank(plan: LaunchPlan, rank: int, local_rank: int, listen_fd: Optional[int] = None) -> None:
    """Make this process `rank` of `plan`'s job: threads, device, process group, ipc groups, layout
    mesh, `context`, and every RNG seeded. Undo with `teardown_rank`. With `listen_fd`, this rank
    hosts the job's TCPStore on that already-bound socket."""
    torch.set_num_threads(plan.threads_per_rank)
    device = torch.device(plan.device)
    if plan.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    store = _store(plan, rank, listen_fd)
    dist.init_process_group(
        backend=plan.backend,
        store=store,
        rank=rank,
        world_size=plan.world_size,
        timeout=_timeout(plan),
        device_id=device if plan.device == "cuda" else None,
    )
    own_group: Optional[Any] = None
    for members in plan.groups:
        group = dist.new_group(members)
        if rank in members:
            own_group = group
    mesh = _layout_mesh(plan)
    _all_joined(store, plan.world_size)
    context.enter(plan, rank, local_rank, device, own_group, mesh)
    _seed(plan.platform.seed)


def _all_joined(store: Any, world_size: int) -> None:
    """Wait until every rank has its process group and groups. Without it, a rank whose task ends at
    once tears its group down while a slower peer is still connecting, and the peer fails with gloo's
    "Connection closed by peer" (seen with the caller as rank 0). Store-based, so no device is involved."""
    if store.add("ddpw/joined", 1) == world_size:
        store.set("ddpw/all_joined", "1")
    store.wait(["ddpw/all_joined"])


def _layout_mesh(plan: LaunchPlan) -> Optional[DeviceMesh]:
    """The DeviceMesh of `platform.layout` (axes pipeline, data, tensor); None when every rank is
    data-parallel: then the world group is the data group and no extra groups are worth creating."""
    layout = plan.platform.layout
    if layout.is_data_only:
        return None
    sizes = layout.sizes(plan.world_size)
    return init_device_mesh(plan.device, tuple(sizes.values()), mesh_dim_names=tuple(sizes))


def _store(plan: LaunchPlan, rank: int, listen_fd: Optional[int]) -> Any:
    """The job's rendezvous store: a private file, or the TCPStore that rank 0 hosts (on the socket
    the controller bound, when given) and every other rank joins."""
    if plan.init_method.startswith("file://"):
        return dist.FileStore(plan.init_method.removeprefix("file://"), plan.world_size)
    hosts = listen_fd is not None or (rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")
    return dist.TCPStore(
        plan.master_addr,
        plan.master_port,
        plan.world_size,
        is_master=hosts,
        timeout=_timeout(plan),
        wait_for_workers=False,
        master_listen_fd=listen_fd,
    )


def _timeout(plan: LaunchPlan) -> Any:
    from datetime import timedelta

    return timedelta(minutes=plan.platform.collective_timeout_min)


def warm_up() -> None:
    """Import, once in the rank starter, what every rank would otherwise import for itself as it
    starts: numpy's random module (torch loads numpy but not it), which seeding needs."""
    try:
        import numpy.random  # noqa: F401
    except ImportError:
        pass


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def teardown_rank() -> None:
    """Destroy the process group (if any) and clear `context`; the process can join another job."""
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        _forget_failed_init()
    context.leave()


def _forget_failed_init() -> None:
    """Undo what a failed `init_process_group` leaves behind: it used up a process-group name (torch
    counts them), so this process's next default group would get another name than its new peers'
    and wait for them forever. `destroy_process_group` resets the same counter after a success."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None))
