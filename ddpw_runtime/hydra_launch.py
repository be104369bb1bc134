"""Hydra side of the local launcher: one Hydra job = one distributed job.

For each job: compose its config, read and validate its `platform` (all jobs before the first starts),
then call Hydra's `run_job` once with a task that starts the ranks, so the output dir, `.hydra/`, the
job log and the callbacks happen exactly once per job.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, List, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from ddpw_conf import LocalLauncherConf, Platform, platform_from_config
from ddpw_conf.run_mode import lone_run
from ddpw_runtime import hydra_state
from ddpw_runtime.engine import check, describe, run_ranks
from ddpw_runtime.job_configs import forget_unused, job_config
from ddpw_runtime.job_summary import JobConsole

log = logging.getLogger(__name__)


class RankTask:
    """The task `run_job` calls in the controller: runs the user's task on every rank and returns
    rank 0's value; every rank's value is kept in `rank_values`. Prints the job's start line and end
    summary (`job_summary`); `job_idx` is the job's number in the sweep."""

    def __init__(
        self, task_function: TaskFunction, platform: Platform, stop_grace_s: float, interrupt_grace_s: float,
        job_idx: int = 0,
    ) -> None:
        self.task_function = task_function
        self.job_idx = job_idx
        self.platform = platform
        self.stop_grace_s = stop_grace_s
        self.interrupt_grace_s = interrupt_grace_s
        self.rank_values: List[Any] = []

    def __call__(self, cfg: DictConfig) -> Any:
        runtime = HydraConfig.get().runtime
        output_dir = Path(runtime.output_dir)
        console = JobConsole(
            self.job_idx, self.platform.world_size, self.platform.device, output_dir, Path(runtime.cwd)
        )
        console.started()
        started = time.monotonic()
        try:
            results = run_ranks(
                self.task_function,
                (cfg,),
                {},
                self.platform,
                log_dir=output_dir,
                hydra_state=hydra_state.pack(),
                stop_grace_s=self.stop_grace_s,
                interrupt_grace_s=self.interrupt_grace_s,
            )
        except Exception as error:
            console.failed(error, time.monotonic() - started)
            raise
        console.completed(time.monotonic() - started)
        self.rank_values = [r.value if r.value_text is None else r.value_text for r in results]
        return self.rank_values[0]


def job_platform(sweep_config: DictConfig) -> Platform:
    """The `platform` of one composed job config, validated on this machine."""
    return check(platform_from_config(OmegaConf.select(sweep_config, "platform")))


def launch(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    options: LocalLauncherConf,
) -> List[JobReturn]:
    """Run each job of a batch as a distributed job; one JobReturn per job, in order."""
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    # A lone job of a plain run (the `ddpw` node points the sweep dir at the run dir) lands in the
    # run dir itself, where a normal run would put it.
    run_like = lone_run(config, len(job_overrides), initial_job_idx)
    jobs = []
    try:
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            sweep_config = job_config(hydra_context, config, overrides)
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            jobs.append((idx, overrides, sweep_config, job_platform(sweep_config)))
    finally:
        forget_unused(hydra_context)

    runs: List[JobReturn] = []
    for idx, overrides, sweep_config, platform in jobs:
        shown = " ".join(filter_overrides(overrides))
        log.info(f"#{idx} : {shown}")
        if options.dry_run:
            out_dir = _job_dir(sweep_config, run_like)
            print(f"--- job #{idx}: {shown or '(no overrides)'} (dry run, nothing started)\n"
                  f"{describe(platform, out_dir)}")
            runs.append(JobReturn(overrides=list(overrides), cfg=sweep_config, status=JobStatus.COMPLETED))
            continue
        task = RankTask(task_function, platform, options.stop_grace_s, options.interrupt_grace_s, job_idx=idx)
        try:
            ret = run_job(
                hydra_context=hydra_context,
                task_function=task,
                config=sweep_config,
                job_dir_key="hydra.run.dir" if run_like else "hydra.sweep.dir",
                job_subdir_key=None if run_like else "hydra.sweep.subdir",
            )
        except KeyboardInterrupt:
            sys.stderr.write(f"Interrupted: every rank of job #{idx} was stopped.\n")
            raise SystemExit(130) from None
        ret.rank_values = task.rank_values  # type: ignore[attr-defined]
        runs.append(ret)
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    return runs


def _job_dir(sweep_config: DictConfig, run_like: bool) -> Path:
    HydraConfig.instance().set_config(sweep_config)
    if run_like:
        return Path(str(sweep_config.hydra.run.dir))
    return Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
