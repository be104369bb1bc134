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
import uuid
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import CodeType
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

from ddpw_conf import Platform
from ddpw_conf.launcher import LauncherOptions, selected_options
from ddpw_runtime import _compat
from ddpw_runtime.errors import Interrupted, RankFailure, Terminated
from ddpw_runtime.hydra_jobs import interrupts
from ddpw_runtime.hydra_jobs.prepare import hydra_config_of, job_check, pin_now
from ddpw_runtime.hydra_jobs.summary import JobConsole, stopped_line
from ddpw_runtime.hydra_jobs.task import JobTask
from ddpw_runtime.launch.caller_rank import CallerRank, check_caller_rank
from ddpw_runtime.launch.console import CallerOutput
from ddpw_runtime.launch.engine import LocalJob, NodeJob, describe, restart_after, settle, starter_for
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
        interrupts.install()
        _compat.notify_last(self)  # so the job's return is final when the others' on_job_end sees it
        with hydra_config_of(config):
            platform = _compat.report_like_hydra(lambda: checked_platform(config, options))
            pin_now(config)
            if options.dry_run:
                output_dir = Path(str(config.hydra.run.dir)).absolute()
                print(f"--- job #0: {' '.join(config.hydra.overrides.task) or '(no overrides)'} (dry run, nothing "
                      f"started)\n{describe(platform, output_dir)}")
                sys.exit(0)
        starter_for(platform, torch_here=True)  # this process is rank 0

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
    platform = options.platform_of(config)
    job_check(options)(platform)
    check_caller_rank(platform)
    return platform


class RankZeroHere:
    """One plain run's job, with this process as rank 0: made when the task is about to run, finished
    with the task's `JobReturn`. Any failure to start ends the program as Hydra ends a failed run. A
    failed run is started again while restarts are left (`hydra.launcher.max_restarts`): the other
    ranks are started again, and rank 0 calls the task again here."""

    def __init__(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        self.output: CallerOutput | None = None
        self._running = ExitStack()
        try:
            _compat.report_like_hydra(lambda: self._start(task_cfg, task_function))
        except (KeyboardInterrupt, Terminated) as stopped:  # before any rank ran: say so, as a job says it
            signum = signal.SIGINT if isinstance(stopped, KeyboardInterrupt) else signal.SIGTERM
            sys.stderr.write(stopped_line(0, signum) + "\n")
            raise

    def _start(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        hydra = HydraConfig.get()
        options = selected_launcher(hydra)
        assert options is not None
        platform = checked_platform(task_cfg, options)
        output_dir = Path(str(hydra.runtime.output_dir))
        self.console = JobConsole(0, platform, output_dir, Path(str(hydra.runtime.cwd)))
        self.started = time.monotonic()
        self.job = NodeJob(platform, output_dir, Grace(options.stop_grace_s, options.interrupt_grace_s),
                           run_id=uuid.uuid4().hex[:12], max_restarts=options.max_restarts)
        self.task = TaskCall(task_function, (task_cfg,))
        self._faulthandler = faulthandler.is_enabled()
        self.console.started()
        self._running.enter_context(interrupts.job_running())
        self._begin()
        atexit.register(self._abandoned)
        try:
            self.rank.enter_rank()
        except Exception as error:  # rank 0 could not join: the job's error says why (often another rank)
            ret = JobReturn(status=JobStatus.FAILED, _return_value=error)
            self.finish(ret)
            failure = _compat.job_error(ret)
            assert failure is not None
            raise failure from None

    def _begin(self) -> None:
        """Start a run of the job: the other ranks, and this process's output to rank 0's log too."""
        self.local = LocalJob(self.task, self.job, host_store_here=True)
        log_file = self.local.plan.log_file(0)
        # The other ranks' console first: it writes to this process's output before rank 0's takes it over.
        self.rank = CallerRank(self.local, _code_of(self.task.target), self._freeze_output, str(log_file), Interrupted)
        self.output = CallerOutput(log_file, self.local.console_prefix(0), 0 in self.local.console_ranks)
        faulthandler.enable()  # a crash of rank 0 leaves its Python stack in its log, as in every rank
        try:
            self.rank.start()
        except BaseException as error:  # nothing of the job stays behind; Hydra reports the error
            self._restore_output()
            self.rank.abort(error)
            self._close()
            raise

    def finish(self, job_return: JobReturn) -> None:
        """Rank 0's task ended as `job_return` says: wait for the others, start the job again after a
        failure while restarts are left, and make a failure of any rank the job's."""
        own_error = _compat.job_error(job_return)
        self.rank.leave_rank(RankResult(0) if own_error is None else RankResult.failure(0, own_error))
        try:
            failure = self._settled()
            restarted = False
            while isinstance(failure, RankFailure) and restart_after(self.job, failure):
                self.rank.close()
                self.local.close()
                self.job = replace(self.job, restart_count=self.job.restart_count + 1)
                self._begin()
                value = self.rank.call(self.task)
                own_error, restarted = self.rank.own_error, True
                failure = self._settled()
            if failure is None:
                self.console.completed(time.monotonic() - self.started)
                if restarted:
                    job_return.status, job_return.return_value = JobStatus.COMPLETED, value
                return
            self.console.failed(failure, time.monotonic() - self.started)
            if not (isinstance(failure, RankFailure) and failure.rank == 0 and own_error is not None):
                job_return.status = JobStatus.FAILED  # rank 0's own error stays the job's, as Hydra shows it
                job_return.return_value = failure
            elif restarted:
                job_return.status, job_return.return_value = JobStatus.FAILED, own_error
        finally:
            self._close()

    def _settled(self) -> Exception | None:
        """Wait for the other ranks of this run; why the job failed, or None."""
        self._restore_output()
        try:
            settle(self.job, self.rank.finish())
        except Exception as failure:
            return failure
        return None

    def _abandoned(self) -> None:
        """The program exits while rank 0's task never returned (Ctrl-C, SIGTERM, `sys.exit`): stop the
        other ranks, passing the signal on with its grace."""
        exc = getattr(sys, "last_value", None) or SystemExit()
        self._restore_output()
        self.rank.abort(exc)
        if isinstance(exc, KeyboardInterrupt):
            sys.stderr.write(stopped_line(0, signal.SIGINT) + "\n")
        elif self.rank.interrupted is not None:
            sys.stderr.write(stopped_line(0, self.rank.interrupted) + "\n")
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
        self._running.close()


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
