"""Each job's config composed once, not twice: Hydra's sweepers compose every job's config to check the batch
(`Sweeper.validate_batch_is_legal`) and throw it away, then the launcher composes it again (tens of ms a job).
`ComposedOnce` stands in for the sweep's config loader and keeps what the check composed for the launcher; what no
launch took is dropped at the end of each launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.types import HydraContext
from omegaconf import DictConfig


class ComposedOnce:
    """A config loader that keeps the job configs it composed until the launcher takes them; else the wrapped one."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "kept"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """Compose one job's config (as the wrapped loader does) and keep it for the launcher."""
        config = self.loader.load_sweep_config(master_config, sweep_overrides)
        self.kept[(id(master_config), tuple(sweep_overrides))] = config
        return config


def compose_once(hydra_context: HydraContext) -> None:
    """Make the sweep's checks and this launcher share their compositions (see the module docstring)."""
    if not isinstance(hydra_context.config_loader, ComposedOnce):
        hydra_context.config_loader = ComposedOnce(hydra_context.config_loader)  # type: ignore[assignment]


def job_config(hydra_context: HydraContext, master_config: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The composed config of one job: the one a check composed, or a new one (at most once per launch)."""
    loader = hydra_context.config_loader
    if isinstance(loader, ComposedOnce):
        kept = loader.kept.pop((id(master_config), tuple(overrides)), None)
        if kept is not None:
            return kept
        loader = loader.loader
    return loader.load_sweep_config(master_config, list(overrides))


def forget_unused(hydra_context: HydraContext) -> None:
    """Drop what checks composed but no launch took (called when a launch ends)."""
    loader = hydra_context.config_loader
    if isinstance(loader, ComposedOnce):
        loader.kept.clear()
