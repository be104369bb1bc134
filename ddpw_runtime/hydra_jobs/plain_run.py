"""A plain run (no `-m`) with a ddpw launcher is Hydra's own run mode, with the user's process as rank 0.

Hydra uses a launcher only in multirun, and a launcher option cannot change the mode. So the launcher
options install this callback instead, and Hydra runs the job as in any plain run: output in
`hydra.run.dir`, `.hydra/` and the job log there, `on_run_*` and `on_job_*` with the user's task
function, Hydra's errors, `--experimental-rerun`. Around the task, the callback makes the user's own
process rank 0 (it keeps the terminal: progress bars, colours and `pdb` work) and starts and supervises
the other ranks (`launch/caller_rank.py`):

- `on_run_start`: every check of the platform and the launcher options, before anything starts.
- `on_job_start`: rank 0's output to its log file too, the other ranks started, this process joined
  to the process group.
- `on_job_end`: rank 0 leaves the group, the other ranks are waited for; when any rank failed, the
  job's return is the root cause (`RankFailure`), which Hydra then reports as a failed run.

When the task ends by Ctrl-C, SIGTERM or `sys.exit`, Hydra calls no `on_job_end`; the other ranks are
then stopped (with their grace) as the program exits.
"""

from __future__ import annotations

import atexit
import copy
import faulthandler
import signal
import sys
import time
from pathlib import Path
from types import CodeType
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ddpw_conf import Platform, platform_from_config
from ddpw_conf.launcher import LauncherOptions, selected_options
from ddpw_runtime import _compat
from ddpw_runtime.errors import Interrupted, RankFailure
from ddpw_runtime.hydra_jobs.prepare import hydra_config_of, job_check, pin_now
from ddpw_runtime.hydra_jobs.summary import JobConsole, interrupted_line
from ddpw_runtime.hydra_jobs.task import JobTask
from ddpw_runtime.launch.caller_rank import CallerRank, check_caller_rank
from ddpw_runtime.launch.console import CallerOutput
from ddpw_runtime.launch.engine import LocalJob, NodeJob, describe, settle
from ddpw_runtime.launch.payload import TaskCall
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.launch.supervisor import Grace


class PlainRun(Callback):
    """The callback the ddpw launcher options install (see the module docstring). It acts only in a
    plain run with a ddpw launcher selected; in a multirun the launcher does the work."""

    def __init__(self) -> None:
        self._job: RankZeroHere | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check the platform and the launcher options (a bad value ends the run as Hydra ends it on a
        bad config, before anything starts), pin `${now:...}` values for every rank; a dry run prints
        the plan and ends there."""
        options = _compat.report_like_hydra(lambda: selected_launcher(config.hydra))
        if options is None:
            return
        _compat.notify_last(self)  # so the job's return is final when the others' on_job_end sees it
        with hydra_config_of(config):
            platform = _compat.report_like_hydra(lambda: checked_platform(config, options))
            pin_now(config)
            if options.dry_run:
                output_dir = Path(str(config.hydra.run.dir)).absolute()
                print(f"--- job #0: {' '.join(config.hydra.overrides.task) or '(no overrides)'} (dry run, nothing "
                      f"started)\n{describe(platform, output_dir)}")
                sys.exit(0)

    def on_job_start(self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any) -> None:
        """Make this process rank 0 of the job and start the other ranks."""
        if config.hydra.mode is not RunMode.RUN or isinstance(task_function, JobTask):
            return
        if selected_launcher(config.hydra) is not None:
            self._job = RankZeroHere(_task_config(config), task_function)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Wait for the other ranks; a failure of any rank becomes the job's failure."""
        job, self._job = self._job, None
        if job is not None:
            job.finish(job_return)


def selected_launcher(hydra: Any) -> LauncherOptions | None:
    """The selected launcher's options (`hydra` is Hydra's node of the run's config) when it is a ddpw
    launcher (a plain run whose launcher was replaced on the command line keeps this callback but has
    nothing to do)."""
    return selected_options(hydra.launcher)


def checked_platform(config: DictConfig, options: LauncherOptions) -> Platform:
    """The platform of a plain run's job config (`config`, with or without its `hydra` node), after
    every check a plain run must pass."""
    platform = platform_from_config(OmegaConf.select(config, "platform"))
    job_check(options)(platform)
    check_caller_rank(platform)
    return platform


class RankZeroHere:
    """One plain run's job, with this process as rank 0: made when the task is about to run, finished
    with the task's `JobReturn`. Any failure to start ends the program as Hydra ends a failed run."""

    def __init__(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        _compat.report_like_hydra(lambda: self._start(task_cfg, task_function))

    def _start(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        hydra = HydraConfig.get()
        options = selected_launcher(hydra)
        assert options is not None
        platform = checked_platform(task_cfg, options)
        output_dir = Path(str(hydra.runtime.output_dir))
        self.console = JobConsole(0, platform, output_dir, Path(str(hydra.runtime.cwd)))
        self.started = time.monotonic()
        self.job = NodeJob(platform, output_dir, Grace(options.stop_grace_s, options.interrupt_grace_s),
                           max_restarts=options.max_restarts)
        self.console.started()
        self.local = LocalJob(TaskCall(task_function, (task_cfg,)), self.job, host_store_here=True)
        log_file = self.local.plan.log_file(0)
        # The other ranks' console first: it writes to this process's output before rank 0's takes it over.
        self.rank = CallerRank(self.local, _code_of(task_function), self._freeze_output, str(log_file), Interrupted)
        shown = 0 in self.local.console_ranks
        self.output: CallerOutput | None = CallerOutput(log_file, self.local.console_prefix(0), shown)
        self._faulthandler = faulthandler.is_enabled()
        faulthandler.enable()  # a crash of rank 0 leaves its Python stack in its log, as in every rank
        try:
            self.rank.start()
        except BaseException as error:  # nothing of the job stays behind; Hydra reports the error
            self._restore_output()
            self.rank.abort(error)
            self._close()
            raise
        atexit.register(self._abandoned)
        try:
            self.rank.enter_rank()
        except Exception as error:  # rank 0 could not join: the job's error says why (often another rank)
            ret = JobReturn(status=JobStatus.FAILED, _return_value=error)
            self.finish(ret)
            failure = _compat.job_error(ret)
            assert failure is not None
            raise failure from None

    def finish(self, job_return: JobReturn) -> None:
        """Rank 0's task ended as `job_return` says: wait for the others, and make a failure of any rank
        the job's."""
        error = _compat.job_error(job_return)
        own = RankResult(0) if error is None else RankResult.failure(0, error)
        try:
            self.rank.leave_rank(own)
            self._restore_output()
            outcomes = self.rank.finish()
            settle(self.job, outcomes)
        except Exception as failure:
            self.console.failed(failure, time.monotonic() - self.started)
            if not (isinstance(failure, RankFailure) and failure.rank == 0 and error is not None):
                job_return.status = JobStatus.FAILED  # rank 0's own error stays the job's, as Hydra shows it
                job_return.return_value = failure
        else:
            self.console.completed(time.monotonic() - self.started)
        finally:
            self._close()

    def _abandoned(self) -> None:
        """The program exits while rank 0's task never returned (Ctrl-C, SIGTERM, `sys.exit`): stop the
        other ranks, passing the signal on with its grace."""
        exc = getattr(sys, "last_value", None) or SystemExit()
        self._restore_output()
        self.rank.abort(exc)
        if self.rank.interrupted == signal.SIGINT or isinstance(exc, KeyboardInterrupt):
            sys.stderr.write(interrupted_line(0) + "\n")
        self._close()

    def _freeze_output(self) -> None:
        if self.output is not None:
            self.output.freeze()

    def _restore_output(self) -> None:
        if self.output is not None:
            self.output.stop()
            self.output = None
            if not self._faulthandler:
                faulthandler.disable()

    def _close(self) -> None:
        atexit.unregister(self._abandoned)
        self.rank.close()
        self.local.close()


def _task_config(config: DictConfig) -> DictConfig:
    """The task's config, as `run_job` makes it from the job's (which on_job_start gets)."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def _code_of(task_function: Any) -> CodeType | None:
    """The code object that runs when `task_function` is called (a function, a method, a partial, an
    object with `__call__`)."""
    target = getattr(task_function, "func", task_function)
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    return code if isinstance(code, CodeType) else None
