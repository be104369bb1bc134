"""`hydra/launcher=ddpw_slurm`: each Hydra job runs as a distributed job on SLURM nodes (submitit)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn

from hydra_plugins.hydra_ddpw_launcher.base import DdpwLauncher

if TYPE_CHECKING:  # the options and the runtime are imported when a launcher is made, not when Hydra discovers plugins
    from ddpw_conf.launcher import SlurmLauncherConf
    from ddpw_runtime.hydra_jobs.prepare import PreparedJob


class DdpwSlurmLauncher(DdpwLauncher):
    """Submits every job of a sweep to SLURM and waits for it (see `ddpw_runtime.slurm.submit`)."""

    options: SlurmLauncherConf

    def __init__(self, **options: Any) -> None:
        from ddpw_conf.launcher import SlurmLauncherConf

        self.options = SlurmLauncherConf.from_mapping(options)

    def run_jobs(self, jobs: list[PreparedJob]) -> list[JobReturn]:
        """Submit each job (equal resources as one job array) and wait."""
        from ddpw_runtime.slurm.submit import run_jobs

        return run_jobs(self.hydra_context, self.task_function, jobs, self.options, self.summary)
