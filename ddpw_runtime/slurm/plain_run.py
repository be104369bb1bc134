"""A plain run (no `-m`) with `hydra/launcher=ddpw_slurm`: the job is submitted and waited for.

The task runs on the allocation, not in this process, so this process cannot be rank 0 as in a local
plain run. At `on_run_start`, the callback checks the job, submits it as a lone job whose output goes
to `hydra.run.dir` (node 0 runs Hydra's `run_job` there: `.hydra/`, the job log and the `on_job_*`
callbacks happen there, as in a multirun), shows rank 0's output as it comes, and ends the program
with the job's outcome: status 0, or the root cause reported as Hydra reports a failed run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from ddpw_conf.launcher import SlurmLauncherConf, selected_options
from ddpw_runtime import _compat
from ddpw_runtime.hydra_jobs.plain_run import PlainRun
from ddpw_runtime.hydra_jobs.prepare import RUN_DIR_KEYS, prepared
from ddpw_runtime.slurm.submit import run_jobs


class SlurmPlainRun(PlainRun):
    """The plain-run callback of `hydra/launcher=ddpw_slurm` (see the module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Submit the run's job, wait for it, and end the program with its outcome."""
        options = _compat.report_like_hydra(lambda: selected_options(config.hydra.launcher))
        if not isinstance(options, SlurmLauncherConf):
            return
        task_function = _compat.task_function_of_run()
        if task_function is None:
            return
        overrides = list(config.hydra.overrides.task)
        job = _compat.report_like_hydra(lambda: prepared(config, 0, overrides, options, RUN_DIR_KEYS))
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                               callbacks=_compat.run_callbacks(config))
        folder = _folder(config, options, job.output_dir)
        (ret,) = _compat.report_like_hydra(
            lambda: run_jobs(context, task_function, [job], options, None, folder, job.output_dir)
        )
        _compat.report_like_hydra(lambda: ret.return_value)  # a failed job: reported, status 1
        sys.exit(0)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Nothing: the job runs on the allocation."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Nothing: the job runs on the allocation."""


def _folder(config: DictConfig, options: SlurmLauncherConf, output_dir: Path) -> Path:
    """submitit's folder: under the run's output dir, unless `hydra.launcher.submitit_folder` was set
    (its default points into the sweep dir, which a plain run does not use)."""
    raw = OmegaConf.to_container(config.hydra.launcher, resolve=False)
    assert isinstance(raw, dict)
    if raw.get("submitit_folder") == SlurmLauncherConf.submitit_folder:
        return output_dir / ".submitit" / "%j"
    return Path(options.submitit_folder).expanduser().absolute()
