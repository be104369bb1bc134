"""The local launcher's jobs: one Hydra job = one distributed job on this machine.

The jobs come prepared (composed, checked: `prepare.py`); Hydra's `run_job` is called once per job
with a `JobTask`, so the output dir, `.hydra/`, the job log and the callbacks happen exactly once per
job.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from ddpw_conf import ConfigError, LocalLauncherConf, platform_from_config
from ddpw_runtime.errors import Interrupted, Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob
from ddpw_runtime.hydra_jobs.summary import stopped_line
from ddpw_runtime.hydra_jobs.task import DdpwJobReturn, JobTask
from ddpw_runtime.launch.engine import NodeJob, describe, starter_for
from ddpw_runtime.launch.supervisor import Grace

log = logging.getLogger(__name__)


def run_jobs(
    hydra_context: HydraContext, task_function: TaskFunction, jobs: Sequence[PreparedJob], options: LocalLauncherConf
) -> list[JobReturn]:
    """Run each (prepared) job of a batch as a distributed job; one JobReturn per job, in order."""
    runs: list[JobReturn] = []
    for job in jobs:
        log.info(f"#{job.idx} : {job.shown}")
        if options.dry_run:
            print(f"--- job #{job.idx}: {job.shown or '(no overrides)'} (dry run, nothing started)\n"
                  f"{describe(job.platform, job.output_dir)}")
            runs.append(DdpwJobReturn(overrides=job.overrides, cfg=job.config, status=JobStatus.COMPLETED))
            continue
        runs.append(_run(hydra_context, task_function, job, options))
        configure_log(job.config.hydra.hydra_logging, job.config.hydra.verbose)
    return runs


def start_starter_early(config: DictConfig, options: LocalLauncherConf) -> None:
    """Start the rank starter for the sweep's platform now, so that it imports torch while Hydra composes
    the jobs (nothing when the platform is unreadable: the checks report that before any job starts)."""
    if options.dry_run:
        return
    try:
        starter_for(platform_from_config(OmegaConf.select(config, "platform")))
    except ConfigError:
        pass


def node_job(job: PreparedJob, options: LocalLauncherConf) -> NodeJob:
    """How the engine runs `job` with these options."""
    return NodeJob(job.platform, job.output_dir, Grace(options.stop_grace_s, options.interrupt_grace_s),
                   max_restarts=options.max_restarts)


def _run(
    hydra_context: HydraContext, task_function: TaskFunction, job: PreparedJob, options: LocalLauncherConf
) -> DdpwJobReturn:
    task = JobTask(task_function, node_job(job, options), job.idx)
    key, subkey = job.dir_keys
    try:
        ret = run_job(hydra_context=hydra_context, task_function=task, config=job.config, job_dir_key=key,
                      job_subdir_key=subkey)
    except KeyboardInterrupt:
        sys.stderr.write(stopped_line(job.idx, signal.SIGINT) + "\n")
        raise Interrupted() from None
    except Terminated:
        sys.stderr.write(stopped_line(job.idx, signal.SIGTERM) + "\n")
        raise
    return DdpwJobReturn.of(ret, task.values)
