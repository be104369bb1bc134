"""`init_process_group()` called by a task whose rank is in its job's process group already (a script written
for torchrun): docs/architecture.md, "A torchrun script's own `init_process_group()`"; and by processes the task starts
with `torch.multiprocessing.spawn`, which cannot make one (docs/from-torchrun.md)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from ddpw_conf import ConfigError
from ddpw_conf.platform import BACKENDS
from ddpw_runtime import _compat
from ddpw_runtime.launch.plan import LaunchPlan

_ORIGINAL: Callable[..., Any] = distributed_c10d.init_process_group  # (imported before any rank replaces it)
_ORIGINAL_START: Callable[..., Any] = torch.multiprocessing.start_processes
_EXPORTED_BY = (dist, distributed_c10d)

_NO_GROUP = "platform.ipc_groups=null, so that hydra-ddpw makes no process group and this call makes it"


@dataclass(frozen=True)
class JobGroup:
    """The process group hydra-ddpw made for `rank` of `plan`'s job, as a task's call would ask for it (`device`: the
    CUDA device it is bound to; `world`: the default group itself)."""

    plan: LaunchPlan
    rank: int
    timeout: timedelta
    device: torch.device | None
    world: Any


_answering: JobGroup | None = None  # the group `answer_task_init` answers for, until `restore_init`


def answer_task_init(group: JobGroup) -> None:
    """From now on, a task's `init_process_group()` that asks for `group` joins it; undo with `restore_init`."""
    global _answering
    _answering = group

    @functools.wraps(_ORIGINAL)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized() or dist.group.WORLD is not group.world:
            return _ORIGINAL(*args, **kwargs)
        mismatch = differs(group, inspect.signature(_ORIGINAL).bind(*args, **kwargs).arguments)
        if mismatch is not None:
            raise mismatch
        return None

    _set_init(init_process_group)


def watch_own_rendezvous(plan: LaunchPlan, rank: int) -> None:
    """With `platform.ipc_groups=null`, from now on: the task's own `init_process_group()` finds the job's store at
    `MASTER_PORT`, hosted for it (every rank is a client: `TORCHELASTIC_USE_AGENT_STORE`, as under torchrun). A call at
    another port (a `MASTER_PORT` the task set, as tutorials' `ddp_main` does) would wait for a store that nobody hosts
    until its timeout (30 minutes): it is refused, naming the fix. So is a call at the job's store with another rank or
    world size than `rank`'s (read from SLURM's variables): its ranks would not make one world (each would train alone,
    or two would ask for one rank). Undo with `restore_init`."""

    @functools.wraps(_ORIGINAL)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        asked = inspect.signature(_ORIGINAL).bind(*args, **kwargs).arguments
        port = _rendezvous_port(asked)
        if port == plan.master_port and _other_ranks(plan, rank, asked) is not None:
            raise _other_ranks_error(plan, rank, asked, made=False)
        if port is not None and port != plan.master_port and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            given = "call it with init_method='env://'" if str(asked.get("init_method")).startswith("tcp://") else \
                "do not set MASTER_PORT"
            raise ConfigError("platform.master_port", plan.platform.master_port,
                              f"the task's init_process_group() looks for its store at port {port}, which nothing "
                              f"hosts (hydra-ddpw hosts this job's at {plan.master_addr}:{plan.master_port}): it would "
                              f"hang. In the task, {given}; or set platform.master_port={port}")
        return _ORIGINAL(*args, **kwargs)

    _set_init(init_process_group)


def _rendezvous_port(asked: dict[str, Any]) -> int | None:
    """The port at which a call of `init_process_group` with the arguments `asked` looks for its store (None: a
    store of its own, or a rendezvous that is not tcp)."""
    init_method = asked.get("init_method")
    if asked.get("store") is not None:
        return None
    if init_method is None or str(init_method).startswith("env://"):
        port = os.environ.get("MASTER_PORT", "")
        return int(port) if port.isdigit() else None
    if str(init_method).startswith("tcp://"):
        with contextlib.suppress(ValueError):
            return urllib.parse.urlparse(str(init_method)).port
    return None


def watch_spawns(plan: LaunchPlan, rank: int) -> None:
    """From now on, the processes the task starts with `torch.multiprocessing.spawn` (or `start_processes`), several
    at once, cannot make a process group of more than one process: each has this rank's `RANK` and the job's
    rendezvous, so such a group waited for its timeout (or joined others' keys). Undo with `restore_init`."""

    @functools.wraps(_ORIGINAL_START)
    def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                        daemon: bool = False, start_method: str = "spawn") -> Any:
        if nprocs == 1:  # one process stands in for its rank (Lightning's ddp_spawn at one device per rank)
            return _ORIGINAL_START(fn, args, nprocs, join, daemon, start_method)
        key = "platform.n_gpus_per_node" if plan.device == "cuda" else "platform.n_procs_per_node"
        refusal = (key, plan.ranks_per_node,
                   f"{nprocs} processes that mp.spawn started in rank {rank} of {plan.world_size} call "
                   f"init_process_group, each with rank {rank}'s RANK and rendezvous: call the function in each rank, "
                   f"fn(int(os.environ['LOCAL_RANK']), ...), with {key}={nprocs} (docs/from-torchrun.md); Lightning: "
                   f"strategy='ddp'")
        try:
            return _ORIGINAL_START(functools.partial(_spawned, fn, refusal), args, nprocs, join, daemon, start_method)
        except torch.multiprocessing.ProcessRaisedException as error:
            if refusal[2] in str(error):  # the job's error says why in one line, the processes' traceback its cause
                raise ConfigError(*refusal) from error
            raise

    _compat.set_start_processes(start_processes)


def _spawned(fn: Callable[..., Any], refusal: tuple[str, Any, str], index: int, *args: Any) -> Any:
    """`fn(index, *args)` in a process that `watch_spawns` let start: its `init_process_group` raises `ConfigError(
    *refusal)`, but for a world of its own of one process (Lightning's ddp_spawn in a one-rank job, as under torchrun).
    """

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        world_size = inspect.signature(_ORIGINAL).bind(*args, **kwargs).arguments.get("world_size", -1)
        if (int(os.environ["WORLD_SIZE"]) if world_size == -1 else world_size) != 1:
            raise ConfigError(*refusal)
        _ORIGINAL(*args, **kwargs)

    _set_init(init_process_group)
    return fn(index, *args)


def restore_init() -> None:
    """`init_process_group` and `torch.multiprocessing.start_processes` are torch's own again."""
    global _answering
    _answering = None
    _set_init(_ORIGINAL)
    _compat.set_start_processes(_ORIGINAL_START)


def _set_init(init_process_group: Callable[..., Any]) -> None:
    for module in _EXPORTED_BY:
        setattr(module, "init_process_group", init_process_group)  # noqa: B010 - mypy refuses assigning a function


def explained(error: BaseException) -> BaseException:
    """What a rank reports for `error`, which its task raised: `error`, unless it is torch's refusal of a second
    default group (from a name bound to torch's own `init_process_group` before the rank joined its job): then a
    `ConfigError` saying so, with `error` as its cause and its traceback."""
    if _answering is None or not isinstance(error, ValueError) or "default process group twice" not in str(error):
        return error
    explanation = ConfigError(
        "platform.ipc_groups", _answering.plan.groups,
        f"the task called torch's own init_process_group (a name bound to it before this rank joined its job, "
        f"as `from torch.distributed import init_process_group` at the top of a module), but hydra-ddpw made "
        f"this job's {_answering.plan.backend} group of {_answering.plan.world_size} rank(s) already: set "
        f"{_NO_GROUP}, or call it as `torch.distributed.init_process_group(...)`")
    explanation.__cause__ = error
    return explanation.with_traceback(error.__traceback__)


def differs(group: JobGroup, asked: dict[str, Any]) -> ConfigError | None:
    """Why a call of `init_process_group` with the arguments `asked` cannot join `group`; None when it can."""
    call = "init_process_group(" + ", ".join(f"{name}={value!r}" for name, value in asked.items()) + ")"
    backend = asked.get("backend")
    if backend is not None and str(backend).lower() != group.plan.backend:
        matching = f"set platform.backend={backend}, or " if str(backend).lower() in BACKENDS else "set "
        return ConfigError("platform.backend", group.plan.backend,
                           f"the task calls {call}, but hydra-ddpw made a {group.plan.backend} group for this job "
                           f"already: {matching}{_NO_GROUP}")
    timeout = asked.get("timeout")
    if timeout is not None and timeout != group.timeout:
        minutes = timeout.total_seconds() / 60
        return ConfigError("platform.collective_timeout_min", group.timeout.total_seconds() / 60,
                           f"the task calls {call}, with another timeout than the group hydra-ddpw made: set "
                           f"platform.collective_timeout_min={minutes:g}, or {_NO_GROUP}")
    other = _other_request(group, asked)
    if other is not None and other == _other_ranks(group.plan, group.rank, asked):
        return _other_ranks_error(group.plan, group.rank, asked, made=True)
    if other is not None:
        return ConfigError("platform.ipc_groups", [],
                           f"the task calls {call}, which asks for {other} than the group of {group.plan.world_size} "
                           f"rank(s) that hydra-ddpw made for this job: set {_NO_GROUP}")
    return None


def _other_request(group: JobGroup, asked: dict[str, Any]) -> str | None:
    """What else than `group` the arguments ask for (rendezvous, store, ranks, device, options)."""
    init_method = asked.get("init_method")
    if init_method not in (None, "env://", f"tcp://{group.plan.master_addr}:{group.plan.master_port}"):
        return f"another rendezvous ({init_method})"
    if asked.get("store") is not None:
        return "another store"
    ranks = _other_ranks(group.plan, group.rank, asked)
    if ranks is not None:
        return ranks
    device_id = asked.get("device_id")
    device = torch.device("cuda", device_id) if isinstance(device_id, int) else device_id
    if device is not None and torch.device(device) != group.device:
        return f"another device ({device_id})"
    if asked.get("pg_options") is not None or asked.get("_ranks") is not None:
        return "other options"
    return None


def _other_ranks(plan: LaunchPlan, rank: int, asked: dict[str, Any]) -> str | None:
    """The other world size or rank than `rank`'s of `plan` that the arguments `asked` ask for; None when they ask for
    none (or for `rank`'s)."""
    if asked.get("world_size", -1) not in (-1, plan.world_size):
        return f"another world size ({asked['world_size']})"
    if asked.get("rank", -1) not in (-1, rank):
        return f"another rank ({asked['rank']})"
    return None


def _other_ranks_error(plan: LaunchPlan, rank: int, asked: dict[str, Any], made: bool) -> ConfigError:
    """Why a call with the arguments `asked`, which ask for another world size or rank than `rank`'s, cannot run, and
    the fix (`made`: hydra-ddpw made the job's group). No setting makes it run: with `platform.ipc_groups=null`, each
    rank would make a world of its own, or two would ask for one rank. Inside a SLURM task whose variables are not
    this rank's (hydra-ddpw starts a node's ranks in one task, as torchrun does), they are where the script read them
    (`init_distributed_mode`'s `elif 'SLURM_PROCID' in os.environ`)."""
    given = ", ".join(f"{name}={asked[name]!r}" for name in ("rank", "world_size") if name in asked)
    call, ours = f"init_process_group({given})", f"RANK={rank} of WORLD_SIZE={plan.world_size}"
    procid, ntasks = os.environ.get("SLURM_PROCID"), os.environ.get("SLURM_NTASKS")
    not_ours = procid is not None and (procid, ntasks) != (str(rank), str(plan.world_size))
    if not_ours and (str(asked.get("rank")) == procid or str(asked.get("world_size")) == ntasks):
        per_node = "platform.n_gpus_per_node" if plan.device == "cuda" else "platform.n_procs_per_node"
        slurm = f"SLURM_PROCID={procid}" + (f", SLURM_NTASKS={ntasks}" if ntasks is not None else "")
        return ConfigError(per_node, plan.ranks_per_node,
                           f"{call} follows {slurm}, which this node's {plan.ranks_per_node} ranks share (one SLURM "
                           f"task per node); this is {ours}: read RANK and WORLD_SIZE before SLURM_PROCID, as "
                           f"torchvision's init_distributed_mode does")
    return ConfigError("platform.ipc_groups", [] if made else None,
                       f"{call} at the job's rendezvous, in {ours}: the ranks would not make one world (each alone, "
                       f"or two as one rank, waiting); pass rank=int(os.environ['RANK']), "
                       f"world_size=int(os.environ['WORLD_SIZE']), or neither")
