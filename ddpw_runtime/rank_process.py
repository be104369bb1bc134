"""What runs in each rank process: environment, log file, Hydra state, device, process group, seed,
then the task; always ends by writing a `RankResult`.

Run as `python -m ddpw_runtime.rank_process PAYLOAD LOCAL_RANK` (spawn) or called from the starter after fork.
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import cloudpickle
import torch
import torch.distributed as dist

from ddpw_runtime import context
from ddpw_runtime.payload import RankPayload, read_payload, write_atomically
from ddpw_runtime.plan import LaunchPlan
from ddpw_runtime.results import RankResult


def main(payload_path: str, local_rank: int) -> int:
    """Run one rank; returns the process exit code (0: the task returned, 1: it raised)."""
    payload = read_payload(Path(payload_path))
    plan = payload.plan
    rank = plan.node_rank * plan.ranks_per_node + local_rank
    _redirect_output(plan.log_file(rank))
    try:
        _enter_caller_state(payload, rank, local_rank)
        target, args, kwargs = cloudpickle.loads(payload.task)
        _setup_torch(plan, rank, local_rank)
        value = target(*args, **kwargs)
        result = RankResult.success(rank, value)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the controller
        sys.stderr.write(f"[rank {rank}] failed:\n")
        if exc.__traceback__ is not None and exc.__traceback__.tb_frame.f_code is main.__code__:
            exc = exc.with_traceback(exc.__traceback__.tb_next)  # start at the task, not here
        traceback.print_exception(exc)
        result = RankResult.failure(rank, exc)
    finally:
        _teardown()
    write_atomically(payload.result_file(rank), cloudpickle.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    return 0 if result.ok else 1


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


def _enter_caller_state(payload: RankPayload, rank: int, local_rank: int) -> None:
    """Take on the controller's environment, cwd, import path and Hydra state, plus the rank's own
    variables (as torchrun sets them)."""
    plan = payload.plan
    os.environ.clear()
    os.environ.update(payload.env)
    os.environ.update(rank_environment(plan, rank, local_rank))
    os.chdir(payload.cwd)
    sys.path[:] = payload.sys_path
    if payload.hydra_state is not None:
        _restore_hydra(payload.hydra_state, rank)


def rank_environment(plan: LaunchPlan, rank: int, local_rank: int) -> dict:
    """The variables torchrun sets for a rank, so libraries inside the task see a launched job."""
    return {
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
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": str(plan.threads_per_rank),
    }


def _restore_hydra(state: bytes, rank: int) -> None:
    """Restore HydraConfig and resolvers, then the job logging (file handlers on rank 0 only, so the
    job log gets each line once)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log
    from omegaconf import OmegaConf

    Singleton.set_state(cloudpickle.loads(state))
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


def _setup_torch(plan: LaunchPlan, rank: int, local_rank: int) -> None:
    """Bind the device, start the process group and its subgroups, seed every RNG."""
    torch.set_num_threads(plan.threads_per_rank)
    device = torch.device(plan.device)
    if plan.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=plan.backend,
        init_method=plan.init_method,
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
    context.enter(plan, rank, local_rank, device, own_group)
    _seed(plan.platform.seed)


def _timeout(plan: LaunchPlan) -> Any:
    from datetime import timedelta

    return timedelta(minutes=plan.platform.timeout_min)


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def _teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    context.leave()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
