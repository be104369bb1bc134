"""What both ddpw launchers share: their options as a validated dataclass, and what `setup` keeps."""

from __future__ import annotations

from typing import Any, Dict, Generic, Optional, Type, TypeVar

from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

Options = TypeVar("Options")


class DdpwLauncher(Launcher, Generic[Options]):
    """A Hydra launcher whose `hydra.launcher.*` options become an `options_type` instance."""

    options_type: Type[Options]

    def __init__(self, **options: Any) -> None:
        plain: Dict[str, Any] = {
            k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in options.items()
        }
        self.options: Options = self.options_type(**plain)
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
