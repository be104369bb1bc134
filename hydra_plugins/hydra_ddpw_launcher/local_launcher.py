"""`hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps`: each Hydra job runs as ranks on this machine."""

from __future__ import annotations

from typing import Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class LocalLauncher(Launcher):
    """Runs every job of a sweep as a distributed job on this machine (see `ddpw_runtime.hydra_launch`)."""

    def __init__(
        self,
        launch_in_run_mode: bool = True,
        dry_run: bool = False,
        stop_grace_s: float = 1.0,
        interrupt_grace_s: float = 10.0,
    ) -> None:
        self.launch_in_run_mode = launch_in_run_mode  # read by the `ddpw` config node, kept for --info
        self.dry_run = dry_run
        self.stop_grace_s = stop_grace_s
        self.interrupt_grace_s = interrupt_grace_s
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run each job as a distributed job; one JobReturn per job."""
        from ddpw_runtime.hydra_launch import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch(
            self.hydra_context, self.task_function, self.config, job_overrides, initial_job_idx,
            dry_run=self.dry_run, stop_grace_s=self.stop_grace_s, interrupt_grace_s=self.interrupt_grace_s,
        )
