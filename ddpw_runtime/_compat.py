"""Every private API of Hydra, OmegaConf, torch and submitit that hydra-ddpw uses, in one place.

Each function says what it buys and what it falls back to; `tests/test_compat.py` runs each against
the pinned versions (hydra-core 1.3, omegaconf 2.3, submitit 1.5, torch 2.x), so an upgrade that breaks
one fails there first. Nothing here imports torch or submitit at import time.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Hydra is imported where it is used: the Wrapper API and the ranks it starts never load it
    from hydra.core.utils import JobReturn


def hydra_state() -> dict[str, Any]:
    """Hydra's and OmegaConf's global state, as `Singleton.get_state()` gives it, without its deep copy
    (the state is pickled right away, which copies it anyway) and without the plugin registry (which
    `get_state` leaves out too). Private: `Singleton._instances`, `BaseContainer._resolvers`. Buys tens
    of milliseconds per job. Fallback: `Singleton.get_state()`."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    try:
        from omegaconf.basecontainer import BaseContainer

        instances = {cls: obj for cls, obj in Singleton._instances.items() if cls is not Plugins}
        return {"instances": instances, "omegaconf_resolvers": BaseContainer._resolvers}
    except AttributeError:
        return Singleton.get_state()


def restore_hydra_state(state: dict[str, Any]) -> None:
    """`Singleton.set_state(state)`, keeping this process's plugin registry: `set_state` rediscovers every
    Hydra plugin (60 ms per rank), which a rank forked from the controller has already. Public API only."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    state["instances"][Plugins] = Plugins.instance()
    Singleton.set_state(state)


def job_error(ret: JobReturn) -> BaseException | None:
    """The exception of a FAILED JobReturn, without raising it (`return_value` raises it and writes
    "Error executing job" to stderr). Private: the `_return_value` field."""
    from hydra.core.utils import JobStatus

    return ret._return_value if ret.status is JobStatus.FAILED else None


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""The `hydra.sweeper._target_` of Hydra's basic sweeper (`hydra/sweeper=basic`), whose jobs follow from
the overrides alone (a resume matches them to an earlier run's). Private: the module that holds it."""


def report_like_hydra(action: Callable[[], Any]) -> Any:
    """`action()`, whose error is reported as Hydra reports the error of a run (its message alone for a
    CompactHydraException, a trimmed traceback otherwise; HYDRA_FULL_ERROR=1 gives the full one) and
    ends the program with status 1, as Hydra does. Used where Hydra would only warn (an error raised in a
    callback) but the run must not go on. Private: `hydra._internal.utils.run_and_report`. Fallback: the
    error's message on stderr and exit status 1 (never a run that goes on)."""
    try:
        from hydra._internal.utils import run_and_report
    except ImportError:
        try:
            return action()
        except Exception as error:
            sys.stderr.write(f"{type(error).__name__}: {error}\n")
            raise SystemExit(1) from error
    try:
        return run_and_report(action)
    except Exception:  # HYDRA_FULL_ERROR=1 (or a debugger): Hydra re-raises, and a callback's error only warns
        traceback.print_exc()
        raise SystemExit(1) from None


def run_job(task_function: Callable[..., Any], *args: Any) -> Any:
    """`task_function(*args)` in a frame named as Hydra's `run_job`, so that Hydra reports what it raises as it
    reports a task's error in its own run: the traceback from the task on, and its hint of HYDRA_FULL_ERROR (for a
    task that rank 0 of a plain run calls again, as the job restarts). Private: `run_and_report` prints the frames
    below the first one named `run_job`, and the whole traceback when there is none. Fallback: the whole one."""
    return task_function(*args)


def forget_failed_process_group() -> None:
    """Undo what a failed `init_process_group` leaves behind: it used up a process-group name (torch
    counts them), so this process's next default group would get another name than its new peers' and
    wait for them forever. `destroy_process_group` resets the same counter after a success. Private:
    `distributed_c10d._world.group_count`. Fallback: nothing (a later job in the same process may hang
    until its collective timeout)."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def forget_exit_handlers() -> None:
    """Drop the `atexit` handlers this process inherited from the process it is a fork of (the rank starter, a fork of a
    controller: those handlers are the controller's, such as stopping its starters, and must not run in its ranks).
    Private: `atexit._clear`. Fallback: nothing (a rank runs no exit handlers: see `run_exit_handlers`)."""
    import atexit

    getattr(atexit, "_clear", lambda: None)()


def run_exit_handlers() -> None:
    """Run this process's `atexit` handlers now, as Python does as it exits (a rank ends with `os._exit`). Private:
    `atexit._run_exitfuncs`; with `forget_exit_handlers`, only where that works too. Fallback: nothing."""
    import atexit

    if hasattr(atexit, "_clear"):
        getattr(atexit, "_run_exitfuncs", lambda: None)()


def open_files(objects: list[Any]) -> list[Any]:
    """The file objects (of any `io` class) among `objects`. Private: `_io._IOBase`, the C base that `io.IOBase` (an
    ABC, 7 times slower to test against over a heap) registers. Fallback: `io.IOBase`. Warnings are off meanwhile: an
    object that warns as its class is read (torch 2.15's deprecated `torch.distributed.reduce_op`) is not the task's
    to show."""
    import io
    import warnings

    base = getattr(sys.modules.get("_io"), "_IOBase", io.IOBase)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [obj for obj in objects if isinstance(obj, base)]


def sbatch_script(command: str, folder: Path, map_count: int | None, **params: Any) -> str:
    """The sbatch script submitit would submit for `params` (the dry run prints it). Private:
    `submitit.slurm.slurm._make_sbatch_string`, the function `SlurmExecutor` itself calls."""
    from submitit.slurm.slurm import _make_sbatch_string

    return str(_make_sbatch_string(command=command, folder=folder, map_count=map_count, **params))


SUBMITIT_ENTRY = "submitit.core._submit"
"""The module each node task runs (`python -u -m submitit.core._submit FOLDER`), as submitit writes it
into the sbatch script; the dry run shows the same command. Private module name of submitit."""


def sacct_state(job: Any) -> str:
    """The state of a submitted submitit job as submitit last read it from sacct, without asking sacct
    again (`job.state` would). Private: `job.watcher.get_state(..., mode="cache")`."""
    return str(job.watcher.get_state(job.job_id, mode="cache"))


def refresh_sacct(job: Any) -> None:
    """Ask sacct once for the states of every job submitit watches (one call for all, as submitit's own
    polling does). Private: `job.watcher.update()`."""
    job.watcher.update()


def node_result_ready(task: Any) -> bool:
    """Whether the node task of a submitit job has written its result file. Private: `paths.result_pickle`."""
    return bool(task.paths.result_pickle.exists())


def compiled_original(model: Any) -> Any:
    """The module that `torch.compile` wrapped in `model`, or None when `model` is not such a wrapper.
    Private: `OptimizedModule._orig_mod` (torch has no public accessor). Fallback: None."""
    from torch import nn

    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, nn.Module) else None


def main_thread_frame() -> Any:
    """The innermost frame the main thread runs now (where a stopped rank 0 was). Private:
    `sys._current_frames`. Fallback: None."""
    frames: dict[int, Any] = getattr(sys, "_current_frames", dict)()
    return frames.get(threading.main_thread().ident or 0)


def torch_without_gpu_support() -> bool:
    """Whether the installed torch is a build without CUDA and ROCm, known without importing torch (which
    takes seconds): read from the `torch/version.py` its build generates (`cuda = None`, `hip = None`).
    Private: that file's layout. Falls back to False (as if it had GPU support)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except (OSError, ValueError):
        return False
    return all(re.search(rf"^{name}\s*(:[^=\n]*)?=\s*None\s*$", text, re.MULTILINE) for name in ("cuda", "hip"))


def flight_recorder_dump() -> bytes | None:
    """What torch's flight recorder holds of this process's collectives (the last `TORCH_FR_BUFFER_SIZE` it
    entered, per process group: name, sequence number, state), pickled as torch's own dumps are: NCCL's recorder
    where the default group runs NCCL, else the one gloo records into. None without a process group. Private:
    `torch._C._distributed_c10d._dump_nccl_trace` / `_dump_fr_trace` (torch has no public dump but its debug
    server). Fallback: None and a line on stderr (the rank's log) saying the hang report names no collectives."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch._C import _distributed_c10d as c10d

    name = "_dump_nccl_trace" if dist.get_backend() == "nccl" else "_dump_fr_trace"
    dump = getattr(c10d, name, None)
    if dump is None:
        sys.stderr.write(f"[ddpw] this torch has no {name}: the hang report names no collectives\n")
        return None
    return bytes(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))


def cpp_warnings_off() -> bool:
    """Stop torch's C++ warnings in this process (c10's log, which c10d's TCPStore client writes to; errors still
    show), as `TORCH_CPP_LOG_LEVEL=ERROR` would have before `import torch` read it: a node's controller, each of whose
    calls that finds node 0's store gone would print a warning with a C++ stack on the console. Private: c10's flag
    `FLAGS_caffe2_log_level`, written through ctypes (torch has no setter). Fallback: False, and the warnings show."""
    import ctypes

    import torch

    for path in sorted((Path(torch.__file__).parent / "lib").glob("*c10.*")):
        try:
            ctypes.c_int.in_dll(ctypes.CDLL(str(path)), "FLAGS_caffe2_log_level").value = 2  # c10's ERROR
            return True
        except (OSError, ValueError):
            continue
    return False
