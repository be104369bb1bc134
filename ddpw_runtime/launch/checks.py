"""Whether a platform can run on this machine and torch, before anything starts: beyond `Platform.validate`, the GPUs,
cores and MPS device here, torch's backends, the rendezvous address and fixed port, and whether `upon_finish` imports.
torch is imported only for platforms that need it (GPUs, MPS, an explicit mpi or nccl backend)."""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from ddpw_conf import ConfigError, Device, Platform
from ddpw_runtime.launch import rendezvous
from ddpw_runtime.launch.devices import cpu_cores
from ddpw_runtime.launch.payload import JOB_ENV
from ddpw_runtime.nodes.sweep_channel import serves_sweep

BUILT_WITH = {"mpi": "is_mpi_available", "nccl": "is_nccl_available"}
"""The backends a torch build may lack, with the `torch.distributed` function that says whether it has them (gloo is
in every build for Linux and macOS)."""


def gpus_available(platform: Platform) -> int | None:
    """The number of CUDA GPUs here, asked only for platforms that use GPUs (it imports torch)."""
    if not platform.uses_gpus:
        return None
    import torch

    return torch.cuda.device_count()


def check(platform: Platform, here: bool = True) -> Platform:
    """Check `platform`; without `here` (a SLURM job, from its submitting host) only what holds anywhere."""
    check_not_under_torchrun(os.environ)
    platform.validate(gpus_available(platform) if here else None)
    if here:
        check_torch(platform)
    if here and platform.device_kind is not Device.SLURM:
        n_cpus = platform.n_cpus_per_node
        if n_cpus is not None and n_cpus > (cores := len(cpu_cores())):
            raise ConfigError("platform.n_cpus_per_node", n_cpus,
                              f"this machine gives this program {cores} CPU cores; ask for at most {cores}")
        # A taken or privileged fixed port is refused by listening on it a moment (on SLURM the first node's controller
        # does; across machines node 0, unless it serves its multirun's store there). Else an address must resolve.
        if platform.master_port is not None and platform.ipc_protocol == "tcp" and not platform.node_rank \
                and not serves_sweep(platform):
            rendezvous.listen(platform, None, None).close()
        elif platform.master_addr is not None:
            rendezvous.resolved(platform.master_addr)
    if platform.upon_finish:
        resolve_callable("platform.upon_finish", platform.upon_finish)
    return platform


def check_not_under_torchrun(environ: Mapping[str, str]) -> None:
    """Raise `ConfigError` when this program is one of several copies torchrun runs here (each would start ranks of its
    own, in the same output dir). A hydra-ddpw rank names its job (`JOB_ENV`): a task may start a job of its own."""
    copies = environ.get("LOCAL_WORLD_SIZE", "").strip()
    if "TORCHELASTIC_RUN_ID" in environ and JOB_ENV not in environ and copies.isdigit() and int(copies) > 1:
        raise ConfigError("LOCAL_WORLD_SIZE", int(copies), f"this program runs under torchrun, as one of {copies} "
                          "copies on this machine, and each copy would start ranks of its own; run it once, as "
                          f"`python <script> ...`: hydra-ddpw starts the ranks (platform.n_procs_per_node={copies}, or "
                          f"hydra/launcher=ddpw_gpu platform.n_gpus_per_node={copies}), or with torchrun "
                          "--nproc_per_node=1")


def check_torch(platform: Platform) -> None:
    """Raise `ConfigError` when this torch cannot give `platform` its device or its backend."""
    if platform.device_kind is Device.MPS:
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError("platform.device", platform.device, "this machine has no MPS device that torch can use "
                              "(Apple silicon, macOS 12.3 or later, a torch built with MPS); use platform.device=cpu "
                              "(hydra/launcher=ddpw_cpu)")
    backend = platform.resolved_backend
    if backend in BUILT_WITH:
        import torch
        import torch.distributed as dist

        if not getattr(dist, BUILT_WITH[backend])():
            raise ConfigError("platform.backend", backend, f"this torch ({torch.__version__}) was built without "
                              f"{backend}; use " + ("backend=gloo, or leave it unset (null) for the automatic "
                                                    "choice, or a torch built with MPI" if backend == "mpi" else
                                                    "backend=gloo"))


def resolve_callable(key: str, path: str) -> Callable[..., Any]:
    """The callable named by `module:function` or `module.function`; ConfigError when it cannot be imported, or
    cannot be called with no arguments (as it is called)."""
    module_name, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(key, path, f"cannot import it ({exc}); give 'package.module:function'") from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed: say how, in one line
        raise ConfigError(key, path, f"importing {module_name} raised {type(exc).__name__}: "
                          f"{(str(exc).strip().splitlines() or [''])[0]}; fix that "
                          "module, or give another 'package.module:function'") from exc
    if not callable(fn):
        raise ConfigError(key, path, "this names something that is not callable")
    try:
        inspect.signature(fn).bind()
    except TypeError as exc:
        raise ConfigError(key, path, f"it is called with no arguments, and this one needs some ({exc}); give a "
                          "function of no arguments") from None
    except ValueError:  # (no signature to read, as of some functions written in C: it is called as it is)
        pass
    return fn


def check_caller_rank(platform: Platform) -> None:
    """Raise ConfigError when the caller cannot be rank 0 of `platform`."""
    why = "rank 0 runs in this process (a plain run, or Wrapper(caller_rank=True))"
    if platform.ipc_protocol != "tcp":
        raise ConfigError("platform.ipc_protocol", platform.ipc_protocol, f"{why}, which hosts the rendezvous store; "
                          "that needs the tcp rendezvous: use ipc_protocol=tcp (or start a multirun with -m, or "
                          "caller_rank=False)")
