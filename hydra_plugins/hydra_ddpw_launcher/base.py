"""What both ddpw launchers share: their options as a validated dataclass, and what `setup` keeps.

The runtime is imported inside `setup` and `launch`: Hydra imports every module under `hydra_plugins` at
each start-up, and those imports must stay cheap (no torch, no submitit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:  # the options and the runtime are imported when a launcher is made, not when Hydra discovers plugins
    from ddpw_conf.launcher import LauncherOptions
    from ddpw_runtime.hydra_jobs.prepare import PreparedJob
    from ddpw_runtime.hydra_jobs.sweep_summary import SweepSummary

class DdpwLauncher(Launcher):
    """A Hydra launcher whose `hydra.launcher.*` options become its own `LauncherOptions`, made by its constructor."""

    options: LauncherOptions
    # Set by `setup`, which Hydra calls before any `launch`.
    config: DictConfig
    hydra_context: HydraContext
    task_function: TaskFunction
    summary: SweepSummary
    """The sweep's summary: one for the whole sweep, whose batches come one launch at a time."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs and the sweep's summary (on a resume, the earlier run's, once checked); from now
        on Ctrl-C and SIGTERM end the sweep cleanly (130, 143)."""
        from ddpw_runtime.hydra_jobs.resume import open_summary, refusing
        from ddpw_runtime.launch import signals

        with refusing(Path(str(config.hydra.sweep.dir))):
            self.summary = open_summary(config, self.options.validate())
        signals.install()
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Check the options and prepare every job of the batch that runs (nothing starts before all are checked; on
        a resume, jobs COMPLETED before are kept), then run them; one JobReturn per job, in order."""
        from ddpw_runtime.hydra_jobs.prepare import prepare_jobs
        from ddpw_runtime.hydra_jobs.resume import plan_launch, refusing

        # (a sweep refused before its first job leaves no dir; once a job ran, its dir holds more and stays)
        with refusing(self.summary.path.parent) if initial_job_idx == 0 else contextlib.nullcontext():
            launch = plan_launch(self.summary, job_overrides, initial_job_idx, self.options.dry_run)
            jobs = prepare_jobs(self.hydra_context, self.config, launch.to_run, self.options)
            return launch.returns(self.run_jobs(jobs) if jobs else [])

    def run_jobs(self, jobs: list[PreparedJob]) -> list[JobReturn]:
        """Run the prepared jobs, each noted in the sweep's `summary` as it ends."""
        raise NotImplementedError
