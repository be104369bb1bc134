"""`Wrapper` and `@wrapper`: the engine without Hydra, from a script, `python -c` or a notebook (docs/without-hydra.md).
A failure raises `RankFailure` in the caller, naming the rank that failed first; no rank outlives the call."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ddpw_conf import ConfigError, Platform
from ddpw_conf.errors import check_bool
from ddpw_runtime.errors import JobTimedOut, RankFailure

_R = TypeVar("_R")

LOG_ROOT = Path("ddpw_logs")
"""Where the default per-call log folders go, relative to the call's working directory."""


class Wrapper:
    """Runs a function as a distributed job on `platform` (validated here, before anything starts), every rank calling
    it with the same arguments (docs/without-hydra.md).

    `log_dir`: where each rank's output goes (`rank_<k>.log`); by default a new `./ddpw_logs/<date>_<time>/` per call,
    also kept in `last_log_dir`. `caller_rank`: the caller itself is rank 0 (its stdout, its objects; imports torch).
    `task_context`: a zero-argument callable returning a context manager entered around the task on every rank.
    `stop_grace_s`: after a failure, the other ranks' time between SIGTERM and SIGKILL; `interrupt_grace_s`: the
    same after Ctrl-C or SIGTERM. `max_restarts`: a failed call starts again up to this many times (as torchrun's
    `--max-restarts`), with the same `run_id()` and log folder; a time limit or an interruption does not.
    """

    def __init__(self, platform: Platform, *, log_dir: str | Path | None = None, caller_rank: bool = False,
                 task_context: Callable[[], AbstractContextManager[Any]] | None = None, stop_grace_s: float = 1.0,
                 interrupt_grace_s: float = 10.0, max_restarts: int = 0) -> None:
        # Imported here: `ddpw_runtime` imports this module, and the starter and rank processes run as `python -m
        # ddpw_runtime.<package>.<module>`, which must not find themselves imported already; nor need a rank's helpers
        # pay for the launcher options.
        from ddpw_conf.launcher import LauncherOptions
        from ddpw_runtime.launch.checks import check, check_caller_rank
        _check_arguments(platform, log_dir, caller_rank, task_context)
        check(platform)
        platform.validate_local()
        LauncherOptions(stop_grace_s=stop_grace_s, interrupt_grace_s=interrupt_grace_s,
                        max_restarts=max_restarts).validate(where="Wrapper.")
        if caller_rank:
            check_caller_rank(platform)
        self.platform = platform
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.caller_rank = caller_rank
        self.task_context = task_context
        self.stop_grace_s = stop_grace_s
        self.interrupt_grace_s = interrupt_grace_s
        self.max_restarts = max_restarts
        self.last_log_dir: Path | None = None  # the log folder of the latest `start`

    def start(self, target: Callable[..., _R], *args: Any, **kwargs: Any) -> list[_R]:
        """Run `target(*args, **kwargs)` on every rank; every rank's return value by global rank (repr() of one that
        cannot be pickled). Raises `RankFailure` when any rank fails; calls `platform.upon_finish` once on success."""
        from ddpw_runtime.launch.engine import run_ranks
        from ddpw_runtime.launch.job import Grace, NodeJob
        from ddpw_runtime.launch.payload import TaskCall
        from ddpw_runtime.procs.caller import run_with_caller_rank

        if not callable(target):
            raise ConfigError("Wrapper.start(target)", target, "give the function every rank calls, then its "
                              "arguments: Wrapper(platform).start(train, cfg)")
        context = sys.modules.get("ddpw_runtime.rank.context")  # (loaded in a rank: not imported here, with torch)
        if context is not None and context.in_rank():
            raise ConfigError("Wrapper.start(target)", getattr(target, "__qualname__", target), "called inside a "
                              "rank of a running job, which starts no job of its own: call the function itself here "
                              "(this process is one rank of the job already), or start it from the caller")
        log_dir = self.log_dir or LOG_ROOT / datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")  # a new folder per call
        self.last_log_dir = log_dir.resolve()
        task = target if self.task_context is None else functools.partial(_in_context, self.task_context, target)
        job = NodeJob(self.platform, log_dir, Grace(self.stop_grace_s, self.interrupt_grace_s),
                      max_restarts=self.max_restarts)
        run = run_with_caller_rank if self.caller_rank else run_ranks
        try:
            return run(TaskCall(task, args, kwargs), job)
        except (RankFailure, JobTimedOut) as error:
            # The same error and cause (the rank's), its traceback starting here: the engine's frames tell nothing.
            raise error.with_traceback(None) from error.__cause__


def wrapper(platform: Platform, **options: Any) -> Callable[[Callable[..., _R]], Callable[..., list[_R]]]:
    """Decorator: calling the function runs it on every rank of `platform` (with `Wrapper`'s `options`), returning
    every rank's value by global rank; its `Wrapper` is its `wrapper` attribute (`train.wrapper.last_log_dir`)."""
    if callable(platform):  # a bare `@wrapper`: else only calling the function would say so, as a wrong platform
        raise ConfigError("wrapper(platform)", getattr(platform, "__qualname__", platform), "give the platform: "
                          "@wrapper(Platform(n_procs_per_node=2)) above the function, not a bare @wrapper")

    def decorate(fn: Callable[..., _R]) -> Callable[..., list[_R]]:
        if not callable(fn):
            raise ConfigError("wrapper(platform)(function)", fn, "decorate the function every rank calls: "
                              "@wrapper(platform) above def train(...)")
        runner = Wrapper(platform, **options)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> list[_R]:
            return runner.start(fn, *args, **kwargs)

        run.wrapper = runner  # type: ignore[attr-defined]
        return run

    return decorate


def _check_arguments(platform: Any, log_dir: Any, caller_rank: Any, task_context: Any) -> None:
    """`ConfigError` for an argument of `Wrapper` of the wrong kind, before anything looks into it."""
    if not isinstance(platform, Platform):
        fix = "Platform(**that_mapping)" if isinstance(platform, Mapping) else "Platform(n_procs_per_node=2)"
        raise ConfigError("Wrapper.platform", platform, f"give a Platform (from ddpw_runtime import Platform), such as "
                          f"{fix}, or ddpw_conf.platform_from_config(node) for a config node")
    if log_dir is not None and (not isinstance(log_dir, (str, os.PathLike)) or Path(log_dir).exists()
                                and not Path(log_dir).is_dir()):
        raise ConfigError("Wrapper.log_dir", log_dir, "give a folder (a str or Path; it is made if it does not exist), "
                          "or None for a new folder per call under ./ddpw_logs")
    check_bool("Wrapper.caller_rank", caller_rank)
    if task_context is not None and not callable(task_context):
        raise ConfigError("Wrapper.task_context", task_context, "give a function of no arguments that returns a "
                          "context manager (such as a @contextlib.contextmanager function), or None")


def _in_context(context: Callable[[], AbstractContextManager[Any]], target: Callable[..., _R], *args: Any,
                **kwargs: Any) -> _R:
    """`target(*args, **kwargs)` inside a fresh `context()` (`Wrapper`'s `task_context`)."""
    with context():
        return target(*args, **kwargs)
