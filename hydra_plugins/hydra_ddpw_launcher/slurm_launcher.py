"""`hydra/launcher=ddpw_slurm`: each Hydra job runs as a distributed job on SLURM nodes (submitit)."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn

from ddpw_conf.launcher import SlurmLauncherConf
from hydra_plugins.hydra_ddpw_launcher.base import DdpwLauncher


class DdpwSlurmLauncher(DdpwLauncher[SlurmLauncherConf]):
    """Submits every job of a sweep to SLURM and waits for it (see `ddpw_runtime.slurm.submit`)."""

    options_type = SlurmLauncherConf

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit each job (equal resources as one job array) and wait; one JobReturn per job."""
        from ddpw_runtime.slurm.submit import launch

        return launch(*self.launching(), job_overrides, initial_job_idx, self.options)
