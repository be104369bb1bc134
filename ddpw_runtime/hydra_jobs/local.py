"""The local launcher's jobs: one Hydra job = one distributed job on this machine.

The jobs come prepared (composed, checked: `prepare.py`); Hydra's `run_job` is called once per job
with a `JobTask`, so the output dir, `.hydra/`, the job log and the callbacks happen exactly once per
job. Jobs run side by side when their devices fit (`side_by_side.py`), else one after another.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from ddpw_conf import ConfigError, LocalLauncherConf
from ddpw_runtime.errors import Interrupted, Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob
from ddpw_runtime.hydra_jobs.side_by_side import Turns, run_side_by_side
from ddpw_runtime.hydra_jobs.summary import stopped_line
from ddpw_runtime.hydra_jobs.sweep_summary import SweepSummary, entry
from ddpw_runtime.hydra_jobs.task import DdpwJobReturn, JobTask
from ddpw_runtime.launch.devices import Devices, Need, Share, cpu_cores, visible_gpus
from ddpw_runtime.launch.engine import NodeJob, describe, gpus_available, starter_for
from ddpw_runtime.launch.interruption import Interruption
from ddpw_runtime.launch.supervisor import Grace, NodeRanks

log = logging.getLogger(__name__)


def run_jobs(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    jobs: Sequence[PreparedJob],
    options: LocalLauncherConf,
    summary: SweepSummary | None = None,
) -> list[JobReturn]:
    """Run each (prepared) job of a batch as a distributed job, side by side when their devices fit
    (`max_parallel_jobs`), else one after another; one JobReturn per job, in order. Each job's entry
    goes to `summary` as it ends."""
    if options.dry_run:
        return [_dry_run(job) for job in jobs]
    devices = side_by_side_devices(jobs, options)
    runner = _Runner(hydra_context, task_function, options, summary)
    if devices is not None:
        beside = functools.partial(runner.run_beside, Turns())
        return run_side_by_side(jobs, devices, options.max_parallel_jobs, beside, runner.ended)
    runs: list[JobReturn] = []
    for job in jobs:
        runs.append(runner.run_alone(job))
        configure_log(job.config.hydra.hydra_logging, job.config.hydra.verbose)
    return runs


def side_by_side_devices(jobs: Sequence[PreparedJob], options: LocalLauncherConf) -> Devices | None:
    """The devices jobs share when they run side by side; None when they run one after another (one
    job, `max_parallel_jobs=1`, or jobs that each take the whole machine)."""
    needs = [Need.of(job.platform) for job in jobs]
    if len(jobs) < 2 or options.max_parallel_jobs == 1 or all(need.whole for need in needs):
        return None
    gpu_jobs = [job.platform for job in jobs if job.platform.uses_gpus]
    gpus = visible_gpus(gpus_available(gpu_jobs[0]) or 0) if gpu_jobs else ()
    return Devices(gpus, cpu_cores())


def _dry_run(job: PreparedJob) -> JobReturn:
    log.info(f"#{job.idx} : {job.shown}")
    print(f"--- job #{job.idx}: {job.shown or '(no overrides)'} (dry run, nothing started)\n"
          f"{describe(job.platform, job.output_dir)}")
    return DdpwJobReturn(overrides=job.overrides, cfg=job.config, status=JobStatus.COMPLETED)


def start_starter_early(config: DictConfig, options: LocalLauncherConf) -> None:
    """Start the rank starter for the sweep's platform now, so that it imports torch while Hydra composes
    the jobs (nothing when the platform is unreadable: the checks report that before any job starts)."""
    if options.dry_run:
        return
    try:
        starter_for(options.platform_of(config))
    except ConfigError:
        pass


def node_job(job: PreparedJob, options: LocalLauncherConf) -> NodeJob:
    """How the engine runs `job` with these options."""
    return NodeJob(job.platform, job.output_dir, Grace(options.stop_grace_s, options.interrupt_grace_s),
                   max_restarts=options.max_restarts)


class _Runner:
    """Runs one job with Hydra's `run_job`, alone or beside others, and notes each in the summary."""

    def __init__(self, hydra_context: HydraContext, task_function: TaskFunction, options: LocalLauncherConf,
                 summary: SweepSummary | None) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.options = options
        self.summary = summary
        self.started: dict[int, float] = {}

    def run_alone(self, job: PreparedJob) -> DdpwJobReturn:
        """Run `job` in this thread, the only one running; Ctrl-C and SIGTERM stop it."""
        log.info(f"#{job.idx} : {job.shown}")
        task = JobTask(self.task_function, node_job(job, self.options), job.idx)
        try:
            ret = self._run_job(job, task)
        except KeyboardInterrupt:
            self.ended(job, KeyboardInterrupt())
            sys.stderr.write(stopped_line(job.idx, signal.SIGINT) + "\n")
            raise Interrupted() from None
        except Terminated as stop:
            self.ended(job, stop)
            sys.stderr.write(stopped_line(job.idx, signal.SIGTERM) + "\n")
            raise
        self.ended(job, ret)
        return ret

    def run_beside(self, turns: Turns, job: PreparedJob, share: Share, interruption: Interruption) -> DdpwJobReturn:
        """Run `job` on `share` (in a thread of its own, beside other jobs, taking `turns` on the
        process's state): its console lines start with its number."""

        @contextmanager
        def while_ranks_run(ranks: NodeRanks) -> Iterator[None]:
            with turns.ranks_running(), interruption.watching(ranks):
                yield

        node = replace(node_job(job, self.options), share=share, console_prefix=f"[job {job.idx}] ",
                       while_ranks_run=while_ranks_run)
        task = JobTask(self.task_function, node, job.idx)
        with turns.turn():
            log.info(f"#{job.idx} : {job.shown}")
            return self._run_job(job, task)

    def _run_job(self, job: PreparedJob, task: JobTask) -> DdpwJobReturn:
        job.pin()  # its output dir and ${now:...} as of its start, as Hydra's basic launcher resolves them
        key, subkey = job.dir_keys
        self.started[job.idx] = time.monotonic()
        ret = run_job(hydra_context=self.hydra_context, task_function=task, config=job.config, job_dir_key=key,
                      job_subdir_key=subkey)
        return DdpwJobReturn.of(ret, task.values)

    def ended(self, job: PreparedJob, outcome: JobReturn | BaseException) -> None:
        """Note how `job` ended in the sweep summary."""
        if self.summary is None:
            return
        duration = time.monotonic() - self.started.get(job.idx, time.monotonic())
        stopped_by = {KeyboardInterrupt: "INTERRUPTED", Terminated: "TERMINATED"}
        how = next((name for kind, name in stopped_by.items() if isinstance(outcome, kind)), None)
        ret = outcome if isinstance(outcome, JobReturn) else None
        if ret is None and how is None:
            return  # an error outside the task: the sweep stops with it
        self.summary.record(entry(job.idx, job.overrides, job.output_dir, duration, ret, how))
