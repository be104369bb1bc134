"""Every private API of Hydra, OmegaConf, torch and submitit that hydra-ddpw uses, in one place.

Each function says what it buys and what it falls back to; `tests/test_compat.py` runs each against
the pinned versions (hydra-core 1.3, omegaconf 2.3, submitit 1.5, torch 2.x), so an upgrade that breaks
one fails there first. Nothing here imports torch or submitit at import time.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Hydra is imported where it is used: the Wrapper API and the ranks it starts never load it
    from hydra.core.utils import JobReturn
    from hydra.types import TaskFunction


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


def report_like_hydra(action: Callable[[], Any]) -> Any:
    """`action()`, whose error is reported as Hydra reports the error of a run (its message alone for a
    CompactHydraException, a trimmed traceback otherwise; HYDRA_FULL_ERROR=1 gives the full one) and
    ends the program with status 1, as Hydra does. Private: `hydra._internal.utils.run_and_report`.
    Fallback: the error propagates."""
    try:
        from hydra._internal.utils import run_and_report
    except ImportError:
        return action()
    return run_and_report(action)


def task_function_of_run() -> TaskFunction | None:
    """The task function of the Hydra run in progress, which Hydra gives to launchers (in multirun)
    but not to run callbacks: a local of the `_run_hydra` frame on this thread's stack. Private:
    `hydra._internal.utils._run_hydra`'s argument. Fallback: None."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_run_hydra" and "task_function" in frame.f_locals:
            task_function: TaskFunction = frame.f_locals["task_function"]
            return task_function
        frame = frame.f_back  # type: ignore[assignment]
    return None


def run_callbacks(config: Any) -> Any:
    """Hydra's `Callbacks` of `config` (what `run_job` calls `on_job_*` on). Private:
    `hydra._internal.callbacks.Callbacks`."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(config)


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


def sbatch_script(command: str, folder: Path, map_count: int | None, **params: Any) -> str:
    """The sbatch script submitit would submit for `params` (the dry run prints it). Private:
    `submitit.slurm.slurm._make_sbatch_string`, the function `SlurmExecutor` itself calls."""
    from submitit.slurm.slurm import _make_sbatch_string

    text: str = _make_sbatch_string(command=command, folder=folder, map_count=map_count, **params)
    return text


SUBMITIT_ENTRY = "submitit.core._submit"
"""The module each node task runs (`python -u -m submitit.core._submit FOLDER`), as submitit writes it
into the sbatch script; the dry run shows the same command. Private module name of submitit."""


def sacct_state(job: Any) -> str:
    """The state of a submitted submitit job as submitit last read it from sacct, without asking sacct
    again (`job.state` would). Private: `job.watcher.get_state(..., mode="cache")`."""
    state: str = job.watcher.get_state(job.job_id, mode="cache")
    return state


def refresh_sacct(job: Any) -> None:
    """Ask sacct once for the states of every job submitit watches (one call for all, as submitit's own
    polling does). Private: `job.watcher.update()`."""
    job.watcher.update()


def node_result_ready(task: Any) -> bool:
    """Whether the node task of a submitit job has written its result file. Private: `paths.result_pickle`."""
    return bool(task.paths.result_pickle.exists())


def collectives_so_far(group: Any) -> int | None:
    """How many collectives `group` has run in this process (its sequence number, which torch keeps for
    gloo and NCCL to find ranks that fell out of step). Private: `ProcessGroup._get_sequence_number_for_group`.
    Fallback: None (unknown; the check that uses it is skipped)."""
    try:
        return int(group._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):
        return None


def wrap_rerun_task(wrap: Callable[[TaskFunction], TaskFunction]) -> None:
    """Make Hydra's `--experimental-rerun` call `wrap(task_function)` instead of the task function (it
    calls the task directly, with no callback; see `hydra_jobs/rerun.py`). Private: the function that
    `@hydra.main` made, which loads the pickled config with its module-level `_get_rerun_conf` and then
    calls its closure cell `task_function`. When this runs while that function is loading the config
    (the pickle imports hydra-ddpw), the cell is replaced at once; otherwise `_get_rerun_conf` is wrapped
    to replace it later. Fallback: nothing (the rerun runs the task in this process alone)."""
    frame = sys._getframe(1)
    while frame is not None and not _runs_hydra_main(frame):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is not None:
        _replace_task(frame, wrap)
        return
    module = sys.modules.get("hydra.main")
    original = getattr(module, "_get_rerun_conf", None)
    if original is None or getattr(original, "wrapped_by_ddpw", False):
        return

    def get_rerun_conf(file_path: str, overrides: list[str]) -> Any:
        config = original(file_path, overrides)
        _replace_task(sys._getframe(1), wrap)
        return config

    get_rerun_conf.wrapped_by_ddpw = True
    module._get_rerun_conf = get_rerun_conf


def _runs_hydra_main(frame: Any) -> bool:
    return bool(frame.f_code.co_name == "decorated_main" and "task_function" in frame.f_locals
                and frame.f_code.co_filename.endswith(("hydra/main.py", "hydra\\main.py")))


def _replace_task(frame: Any, wrap: Callable[[TaskFunction], TaskFunction]) -> None:
    """Replace the `task_function` closure cell of the function whose frame is `frame` by `wrap` of it."""
    import gc
    import types

    task_function = frame.f_locals.get("task_function")
    for fn in gc.get_referrers(frame.f_code):
        if not isinstance(fn, types.FunctionType) or not fn.__closure__:
            continue
        cell = dict(zip(fn.__code__.co_freevars, fn.__closure__, strict=True)).get("task_function")
        if cell is not None and cell.cell_contents is task_function:
            cell.cell_contents = _once(cell, task_function, wrap(task_function))
            return


def _once(cell: Any, original: TaskFunction, wrapped: TaskFunction) -> TaskFunction:
    """`wrapped`, which puts `original` back into `cell` when it is called."""

    def call(cfg: Any) -> Any:
        cell.cell_contents = original
        return wrapped(cfg)

    return call


def notify_last(callback: Any) -> None:
    """Make Hydra call `callback` after every other callback of the run for `on_*_start`, and so before
    them for `on_*_end` (which Hydra calls in reverse order): a plain run's job return is then final
    (every rank waited for) when the user's `on_job_end` sees it. Call it from a callback method.
    Private: the `Callbacks` object of `hydra._internal.callbacks`, found as `self` of the `_notify`
    frame that called the method, and its `callbacks` list (replaced, not changed: `_notify` is
    iterating over it). Fallback: the callbacks keep their order."""
    from hydra._internal.callbacks import Callbacks

    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_notify":
        frame = frame.f_back  # type: ignore[assignment]
    hydra_callbacks = frame.f_locals.get("self") if frame is not None else None
    if isinstance(hydra_callbacks, Callbacks) and callback in hydra_callbacks.callbacks:
        others = [c for c in hydra_callbacks.callbacks if c is not callback]
        hydra_callbacks.callbacks = [*others, callback]


def torch_without_gpu_support() -> bool:
    """Whether the installed torch is a build without CUDA and ROCm, known without importing torch (which
    takes seconds): read from the `torch/version.py` its build generates (`cuda = None`, `hip = None`).
    Private: that file's layout. Falls back to False (as if it had GPU support)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    values: dict[str, ast.expr | None] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            values[node.target.id] = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
    return all(_is_none(values.get(name)) for name in ("cuda", "hip"))


def _is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
