"""The local engine: validate, plan, start the ranks of one node, supervise them, hand back results.

Used by the Hydra launchers and by `Wrapper`; the controller process never imports torch here.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ddpw_conf import Platform
from ddpw_runtime import caller_rank as in_caller
from ddpw_runtime import rendezvous
from ddpw_runtime.console import ConsoleEcho
from ddpw_runtime.payload import RankPayload, pack_task, write_payload
from ddpw_runtime.plan import LaunchPlan, plan_local
from ddpw_runtime.results import RankResult
from ddpw_runtime.starter import get_starter
from ddpw_runtime.supervisor import run_node

log = logging.getLogger(__name__)


def gpus_available(platform: Platform) -> Optional[int]:
    """The number of CUDA GPUs here, asked only for platforms that use GPUs (it imports torch)."""
    if not platform.uses_gpus:
        return None
    import torch

    return torch.cuda.device_count()


def check(platform: Platform) -> Platform:
    """Validate `platform` on this machine and resolve `upon_finish`, before anything starts."""
    platform.validate(gpus_available(platform))
    if platform.upon_finish:
        resolve_callable("platform.upon_finish", platform.upon_finish)
    return platform


def resolve_callable(key: str, path: str) -> Callable[..., Any]:
    """The callable named by `module:function` or `module.function`; ConfigError when it is not there."""
    from ddpw_conf import ConfigError

    module_name, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(key, path, f"cannot import it ({exc}); give 'package.module:function'") from exc
    if not callable(fn):
        raise ConfigError(key, path, "this names something that is not callable")
    return fn


def run_ranks(
    target: Callable[..., Any],
    args: tuple,
    kwargs: Dict[str, Any],
    platform: Platform,
    log_dir: Path,
    hydra_state: Optional[bytes] = None,
    stop_grace_s: float = 1.0,
    node_rank: int = 0,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    caller_rank: bool = False,
    interrupt_grace_s: float = 10.0,
    run_id: Optional[str] = None,
) -> List[RankResult]:
    """Run `target(*args, **kwargs)` on every rank of this node; the results of this node's ranks in
    rank order. Raises RankFailure (root cause first) when any rank fails; no rank outlives the call.

    With `caller_rank`, rank 0 runs in this process (see `caller_rank.py`; this imports torch here).
    `interrupt_grace_s`: after Ctrl-C or SIGTERM, how long the ranks get before they are killed.
    `run_id`: the job's id as the ranks see it (`TORCHELASTIC_RUN_ID`, `ddpw_runtime.run_id()`); the
    same on every node and across restarts when given, else a new random id.
    """
    check(platform)
    if caller_rank:
        in_caller.check(platform)
    starter = get_starter(preload=platform.spawn_method == "forkserver")  # before any socket opens
    hosts_store = node_rank == 0 and platform.ipc_protocol == "tcp"
    listener = rendezvous.listen(platform, master_addr, master_port) if hosts_store else None
    workdir = Path(tempfile.mkdtemp(prefix="ddpw-"))
    try:
        if listener is not None:
            master_port = listener.getsockname()[1]
        plan = plan_local(
            platform, Path(log_dir).resolve(), workdir, run_id or uuid.uuid4().hex[:12], node_rank, master_addr,
            master_port,
        )
        payload = RankPayload(
            plan=plan,
            task=pack_task(target, args, kwargs),
            hydra_state=hydra_state,
            env={**os.environ, **(in_caller.AGENT_STORE_ENV if caller_rank else {})},
            cwd=os.getcwd(),
            sys_path=list(sys.path),
            result_dir=str(workdir),
        )
        if platform.verbose:
            log.info(plan.one_line())
        payload_path = workdir / "payload.pkl"
        write_payload(payload, payload_path)
        with ConsoleEcho({rank: plan.log_file(rank) for rank in plan.console_ranks if rank in plan.global_ranks}):
            if caller_rank:
                assert listener is not None  # caller_rank implies node 0 and tcp (in_caller.check)
                results = in_caller.run_with_caller(
                    starter, payload, payload_path, stop_grace_s, listener.fileno(), target, args, kwargs
                )
            else:
                results = run_node(
                    starter, payload, payload_path, stop_grace_s,
                    listen_fd=listener.fileno() if listener is not None else None,
                    interrupt_grace_s=interrupt_grace_s,
                )
    finally:
        if listener is not None:
            listener.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if platform.upon_finish:
        resolve_callable("platform.upon_finish", platform.upon_finish)()
    return results


def describe(platform: Platform, log_dir: Path) -> str:
    """The platform and launch plan as a dry run prints them (nothing is started)."""
    check(platform)
    plan: LaunchPlan = plan_local(platform, Path(log_dir).resolve(), Path("<private dir>"), "<run id>")
    return f"{plan.describe()}\n--- platform ---\n{platform.summary()}"
