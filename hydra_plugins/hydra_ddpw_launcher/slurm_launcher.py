"""`hydra/launcher=ddpw_slurm`: each Hydra job runs as a distributed job on SLURM nodes (submitit)."""

from __future__ import annotations

from hydra_plugins.hydra_ddpw_launcher.base import DdpwLauncher


class DdpwSlurmLauncher(DdpwLauncher):
    """Submits every job of a sweep to SLURM (equal resources as one job array) and waits for it (see
    `ddpw_runtime.slurm.submit`)."""

    options_class = "SlurmLauncherConf"
    runtime = "ddpw_runtime.slurm.submit"
