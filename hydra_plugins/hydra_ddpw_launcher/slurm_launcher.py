"""`hydra/launcher=ddpw_slurm`: each Hydra job runs as a distributed job on SLURM nodes (submitit)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from ddpw_conf.launcher import SlurmLauncherConf


class SlurmLauncher(Launcher):
    """Submits every job of a sweep to SLURM and waits for it (see `ddpw_runtime.slurm_submit`)."""

    def __init__(self, **options: Any) -> None:
        plain: Dict[str, Any] = {
            k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in options.items()
        }
        self.options = SlurmLauncherConf(**plain)
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit each job (equal resources as one job array) and wait; one JobReturn per job."""
        from ddpw_runtime.slurm_submit import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch(self.hydra_context, self.task_function, self.config, job_overrides, initial_job_idx, self.options)
