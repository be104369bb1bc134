"""Every private API of Hydra, OmegaConf, torch and submitit that hydra-ddpw uses, each with what it buys and its
fallback; `tests/test_compat.py` runs each against the pinned versions (hydra-core 1.3, omegaconf 2.3, submitit 1.5,
torch 2.x), so an upgrade that breaks one fails there first. Nothing here imports torch or submitit at import time."""

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
    """Hydra's and OmegaConf's global state as `Singleton.get_state()` gives it, without its deep copy (it is pickled
    at once) nor the plugin registry: tens of ms per job. Private: `Singleton._instances`,
    `BaseContainer._resolvers`. Fallback: `Singleton.get_state()`."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    try:
        from omegaconf.basecontainer import BaseContainer

        instances = {cls: obj for cls, obj in Singleton._instances.items() if cls is not Plugins}
        return {"instances": instances, "omegaconf_resolvers": BaseContainer._resolvers}
    except AttributeError:
        return Singleton.get_state()


def restore_hydra_state(state: dict[str, Any]) -> None:
    """`Singleton.set_state(state)`, keeping this process's plugin registry (`set_state` would rediscover every
    plugin, 60 ms per rank, which a forked rank has already). Public API only."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    state["instances"][Plugins] = Plugins.instance()
    Singleton.set_state(state)


def job_error(ret: JobReturn) -> BaseException | None:
    """The exception of a FAILED JobReturn, without raising it (`return_value` raises it and writes "Error executing
    job" to stderr). Private: the `_return_value` field."""
    from hydra.core.utils import JobStatus

    return ret._return_value if ret.status is JobStatus.FAILED else None


def config_file(loader: Any, config_path: str) -> Any:
    """The config file `config_path` (a `ConfigResult`: its config and header) as `loader`, Hydra's config loader,
    finds it on the search path; None when missing. Private: `ConfigLoaderImpl.repository`. Fallback: None (the app's
    `???` marks are not read; the launcher's defaults stand in for them, as Hydra's merge leaves them)."""
    repository = getattr(loader, "repository", None)
    return None if repository is None else repository.load_config(config_path)


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""`hydra.sweeper._target_` of Hydra's basic sweeper, whose jobs follow from the overrides alone (a resume matches
them to an earlier run's). Private: the module that holds it."""


def report_like_hydra(action: Callable[[], Any]) -> Any:
    """`action()`, whose error is reported as Hydra reports a run's (HYDRA_FULL_ERROR=1 included) and ends the program
    with status 1, where Hydra would only warn (a callback's error) but the run must not go on. Private:
    `hydra._internal.utils.run_and_report`. Fallback: the error's message on stderr and exit status 1."""
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
    """`task_function(*args)` in a frame named as Hydra's `run_job`, so Hydra reports its error as a task's (from the
    task on, with its HYDRA_FULL_ERROR hint; for a restarted plain run's rank 0). Private: `run_and_report` prints the
    frames below the first named `run_job`. Fallback: the whole traceback."""
    return task_function(*args)


def forget_failed_process_group() -> None:
    """Undo the process-group name a failed `init_process_group` used up (as `destroy_process_group` does after a
    success): else this process's next group is named unlike its new peers' and waits forever. Private:
    `distributed_c10d._world.group_count`. Fallback: nothing (a later job here may hang until its timeout)."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def set_start_processes(start_processes: Callable[..., Any]) -> None:
    """Make `start_processes` what `torch.multiprocessing.start_processes` and `torch.multiprocessing.spawn` call.
    Private: `spawn` calls the `start_processes` of its own module (`torch.multiprocessing.spawn`). Fallback: the
    public name only (a task's `spawn` then starts its processes unwatched)."""
    import torch.multiprocessing

    for module in (torch.multiprocessing, sys.modules.get("torch.multiprocessing.spawn")):
        if hasattr(module, "start_processes"):
            setattr(module, "start_processes", start_processes)  # noqa: B010 - mypy refuses assigning a function


def forget_exit_handlers() -> None:
    """Drop the `atexit` handlers inherited from the process this is a fork of (the controller's, which must not run
    in its ranks). Private: `atexit._clear`. Fallback: nothing (a rank then runs no exit handlers)."""
    import atexit

    getattr(atexit, "_clear", lambda: None)()


def run_exit_handlers() -> None:
    """Run this process's `atexit` handlers now (a rank ends with `os._exit`). Private: `atexit._run_exitfuncs`, only
    where `forget_exit_handlers` works too. Fallback: nothing."""
    import atexit

    if hasattr(atexit, "_clear"):
        getattr(atexit, "_run_exitfuncs", lambda: None)()


def disown_finalizers() -> None:
    """Make the `weakref.finalize` finalizers this process has now (those of the process it is a fork of) run no more
    as it exits: `run_finalizers` then runs only those made since. Public: `finalize.atexit`; private:
    `weakref.finalize._registry`. Fallback: nothing."""
    import weakref

    for pending in list(getattr(weakref.finalize, "_registry", {})):
        pending.atexit = False


def run_finalizers() -> None:
    """Run the `weakref.finalize` finalizers whose `atexit` is true, as Python does as it exits (a rank ends with
    `os._exit`, and its `atexit` list, cleared at its fork, may lack weakref's own handler). Private:
    `weakref.finalize._exitfunc`, which Python registers with `atexit`. Fallback: nothing."""
    import weakref

    getattr(weakref.finalize, "_exitfunc", lambda: None)()


def open_files(objects: list[Any]) -> list[Any]:
    """The file objects among `objects`, warnings off (torch 2.15's `torch.distributed.reduce_op` warns as its class
    is read). Private: `_io._IOBase`, the C base of the ABC `io.IOBase` (7 times slower to test against). Fallback:
    `io.IOBase`."""
    import io
    import warnings

    base = getattr(sys.modules.get("_io"), "_IOBase", io.IOBase)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [obj for obj in objects if isinstance(obj, base)]


def sbatch_script(command: str, folder: Path, map_count: int | None, **params: Any) -> str:
    """The sbatch script submitit would submit for `params`. Private: `submitit.slurm.slurm._make_sbatch_string`."""
    from submitit.slurm.slurm import _make_sbatch_string

    return str(_make_sbatch_string(command=command, folder=folder, map_count=map_count, **params))


SUBMITIT_ENTRY = "submitit.core._submit"
"""The module each node task runs (`python -u -m submitit.core._submit FOLDER`). Private module of submitit."""


def sacct_state(job: Any) -> str:
    """A submitit job's state as last read from sacct, not asking again. Private: `watcher.get_state(mode="cache")`."""
    return str(job.watcher.get_state(job.job_id, mode="cache"))


def refresh_sacct(job: Any) -> None:
    """Ask sacct once for the states of every job submitit watches. Private: `job.watcher.update()`."""
    job.watcher.update()


def node_result_ready(task: Any) -> bool:
    """Whether the node task of a submitit job has written its result file. Private: `paths.result_pickle`."""
    return bool(task.paths.result_pickle.exists())


def node_result_time(task: Any) -> float:
    """When the node task of a submitit job wrote its result file (`time.time()`). Private: `paths.result_pickle`."""
    return float(task.paths.result_pickle.stat().st_mtime)


def mesh_group_options(backend: str, timeout: Any) -> Any:
    """Options that give a DeviceMesh's groups `timeout`, for `init_device_mesh`'s public `backend_override`: it takes
    no timeout, and its groups would wait torch's default (30 minutes), not the job's collective timeout. Private: the
    backend's Options (NCCL's `ProcessGroupNCCL.Options`, gloo's `ProcessGroupGloo._Options`) and their `_timeout`,
    which DeviceMesh reads. Fallback: None (torch's default timeout)."""
    import torch.distributed as dist

    try:
        options = dist.ProcessGroupNCCL.Options() if "nccl" in backend else dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
    except (AttributeError, TypeError, RuntimeError):
        return None
    return options


def compiled_original(model: Any) -> Any:
    """The module `torch.compile` wrapped in `model`, else None. Private: `_orig_mod`. Fallback: None."""
    from torch import nn

    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, nn.Module) else None


def main_thread_frame() -> Any:
    """The innermost frame the main thread runs now. Private: `sys._current_frames`. Fallback: None."""
    frames: dict[int, Any] = getattr(sys, "_current_frames", dict)()
    return frames.get(threading.main_thread().ident or 0)


def import_code() -> Any:
    """The code of importlib's `_find_and_load`, on the stack of every frame inside an import. Private:
    `importlib._bootstrap._find_and_load`. Fallback: None (no frame is seen inside an import)."""
    return getattr(getattr(sys.modules.get("importlib._bootstrap"), "_find_and_load", None), "__code__", None)


def torch_without_gpu_support() -> bool:
    """Whether the installed torch is built without CUDA and ROCm, read from its `torch/version.py` without importing
    torch (seconds). Private: that file's layout. Fallback: False."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except (OSError, ValueError):
        return False
    return all(re.search(rf"^{name}\s*(:[^=\n]*)?=\s*None\s*$", text, re.MULTILINE) for name in ("cuda", "hip"))


def flight_recorder_dump() -> bytes | None:
    """This process's flight recorder (its last collectives per group), pickled as torch's dumps are: NCCL's where the
    default group runs NCCL, else gloo's; None without a group. Private: `torch._C._distributed_c10d._dump_nccl_trace`
    / `_dump_fr_trace`. Fallback: None and a line on stderr."""
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


def cpp_warnings_off(errors_too: bool = False) -> bool:
    """Stop torch's C++ warnings (and its errors, with `errors_too`) in this process, as `TORCH_CPP_LOG_LEVEL=ERROR`
    (`FATAL`) would before `import torch`. Private: c10's flag `FLAGS_caffe2_log_level`, set through ctypes.
    Fallback: False."""
    import ctypes

    import torch

    for path in sorted((Path(torch.__file__).parent / "lib").glob("*c10.*")):
        try:
            ctypes.c_int.in_dll(ctypes.CDLL(str(path)), "FLAGS_caffe2_log_level").value = 3 if errors_too else 2
            return True
        except (OSError, ValueError):
            continue
    return False
