"""What both ddpw launchers share: their options as a validated dataclass, and what `setup` keeps.

The runtime is imported inside `launch`: Hydra imports every module under `hydra_plugins` at each
start-up, and those imports must stay cheap (no torch, no submitit).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from ddpw_conf.launcher import LauncherOptions

Options = TypeVar("Options", bound=LauncherOptions)


class DdpwLauncher(Launcher, Generic[Options]):
    """A Hydra launcher whose `hydra.launcher.*` options become an `options_type` instance."""

    options_type: type[Options]

    def __init__(self, **options: Any) -> None:
        self.options: Options = self.options_type.from_mapping(options)  # type: ignore[assignment]
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what `launch` needs."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launching(self) -> tuple[HydraContext, TaskFunction, DictConfig]:
        """What `setup` kept (Hydra calls `setup` before `launch`)."""
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return self.hydra_context, self.task_function, self.config
