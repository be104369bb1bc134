"""`hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps`: each Hydra job runs as ranks on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.hydra_ddpw_launcher.base import DdpwLauncher

if TYPE_CHECKING:  # the options and the runtime are imported when a launcher is made, not when Hydra discovers plugins
    from ddpw_conf.launcher import LocalLauncherConf
    from ddpw_runtime.hydra_jobs.prepare import PreparedJob


class DdpwLocalLauncher(DdpwLauncher):
    """Runs every job of a sweep as a distributed job on this machine (see `ddpw_runtime.procs.sweep`)."""

    options: LocalLauncherConf

    def __init__(self, **options: Any) -> None:
        from ddpw_conf.launcher import LocalLauncherConf

        self.options = LocalLauncherConf.from_mapping(options)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs; the sweep's checks and this launcher compose each job's config once between
        them (`compose_once`); the rank starter starts now."""
        from ddpw_runtime.hydra_jobs.compose_once import compose_once
        from ddpw_runtime.procs.sweep import start_starter_early

        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        compose_once(hydra_context)
        start_starter_early(config, self.options)

    def run_jobs(self, jobs: list[PreparedJob]) -> list[JobReturn]:
        """Run each job as a distributed job on this machine."""
        from ddpw_runtime.procs.sweep import run_jobs

        return run_jobs(self.hydra_context, self.task_function, jobs, self.options, self.summary)
