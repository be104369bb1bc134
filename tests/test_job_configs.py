"""Each job's config is composed once between the sweep's check and the launcher (job_configs.py),
with Hydra's real config loader and the test app's config."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import HydraContext
from omegaconf import DictConfig

from ddpw_runtime.hydra_jobs.compose_once import compose_once, forget_unused, job_config
from tests.helpers import APPS


class CountingLoader:
    """Hydra's config loader, counting the job configs it composes (a spy; every compose is real)."""

    def __init__(self, loader: object) -> None:
        self.loader = loader
        self.composed: list[list[str]] = []

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: Sequence[str]) -> DictConfig:
        self.composed.append(list(sweep_overrides))
        return self.loader.load_sweep_config(master_config, list(sweep_overrides))  # type: ignore[attr-defined]


@pytest.fixture()
def master() -> Iterator[DictConfig]:
    with initialize_config_dir(config_dir=str(APPS / "conf"), version_base=None):
        yield compose("config", return_hydra_config=True)


@pytest.fixture()
def context(master: DictConfig) -> HydraContext:
    loader = CountingLoader(GlobalHydra.instance().config_loader())
    return HydraContext(config_loader=loader, callbacks=None)  # type: ignore[arg-type]


def counted(context: HydraContext) -> list[list[str]]:
    loader = context.config_loader
    counting: Any = getattr(loader, "loader", loader)
    composed: list[list[str]] = counting.composed
    return composed


def test_launcher_takes_what_the_check_composed(master: DictConfig, context: HydraContext) -> None:
    compose_once(context)
    batch = [["fail_rank=0"], ["fail_rank=1"]]
    checked = [context.config_loader.load_sweep_config(master, overrides) for overrides in batch]  # the sweeper's check
    launched = [job_config(context, master, overrides) for overrides in batch]
    assert [c.fail_rank for c in launched] == [0, 1]
    assert all(a is b for a, b in zip(checked, launched, strict=True))
    assert counted(context) == batch


def test_without_a_check_each_job_is_composed(master: DictConfig, context: HydraContext) -> None:
    compose_once(context)
    first = job_config(context, master, ["fail_rank=0"])
    again = job_config(context, master, ["fail_rank=0"])
    assert first is not again and first == again
    assert counted(context) == [["fail_rank=0"], ["fail_rank=0"]]


def test_unused_compositions_are_dropped(master: DictConfig, context: HydraContext) -> None:
    compose_once(context)
    context.config_loader.load_sweep_config(master, ["fail_rank=0"])
    forget_unused(context)
    job_config(context, master, ["fail_rank=0"])
    assert len(counted(context)) == 2


def test_another_master_config_is_not_reused(master: DictConfig, context: HydraContext) -> None:
    compose_once(context)
    context.config_loader.load_sweep_config(master, ["fail_rank=0"])
    other = master.copy()
    assert job_config(context, other, ["fail_rank=0"]).fail_rank == 0
    assert len(counted(context)) == 2


def test_compose_once_wraps_only_once(context: HydraContext) -> None:
    compose_once(context)
    wrapped = context.config_loader
    compose_once(context)
    assert context.config_loader is wrapped
