"""What hydra-ddpw costs Hydra apps that do not use it: Hydra imports every module under `hydra_plugins`
at each start-up; hydra-ddpw's launcher options are made only when an app loads one
(`hydra_plugins/hydra_ddpw_launcher/_options_source.py`), typed as before."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from ddpw_conf import ConfigError, platform_from_config
from ddpw_conf.launcher import LocalLauncherConf, SlurmLauncherConf, selected_options
from ddpw_conf.store import LAUNCHERS, OPTIONS, OWN_PLATFORM
from ddpw_runtime.launch.checks import check
from hydra_plugins.hydra_ddpw_launcher._options_source import LAUNCHER_OPTIONS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "tests" / "apps" / "conf"

DISCOVER_AND_COMPOSE = """
import json, sys
from hydra import compose, initialize_config_dir
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher

launchers = sorted(type_.__name__ for type_ in Plugins.instance().discover(Launcher))
after_discovery = sorted(m for m in sys.modules if m.startswith(("ddpw", "torch", "submitit")))
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    cfg = compose(config_name="config", overrides=sys.argv[2:], return_hydra_config=True)
print(json.dumps({"launchers": launchers, "after_discovery": after_discovery,
                  "after_compose": sorted(m for m in sys.modules if m.startswith(("ddpw", "torch"))),
                  "launcher": cfg.hydra.launcher._target_}))
"""


def _discover_and_compose(*overrides: str) -> dict:
    out = subprocess.run([sys.executable, "-c", DISCOVER_AND_COMPOSE, str(CONF), *overrides], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    report: dict = json.loads(out.stdout.splitlines()[-1])
    return report


@pytest.mark.subprocess
def test_an_app_that_does_not_select_a_ddpw_launcher_imports_nothing_of_hydra_ddpw_but_the_plugin() -> None:
    report = _discover_and_compose("hydra/launcher=basic")
    assert {"DdpwLocalLauncher", "DdpwSlurmLauncher"} <= set(report["launchers"])  # still discovered
    assert report["after_discovery"] == [] and report["after_compose"] == []
    assert report["launcher"] == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


@pytest.mark.subprocess
def test_selecting_a_ddpw_launcher_loads_its_options_then() -> None:
    report = _discover_and_compose("hydra/launcher=ddpw_cpu")
    assert report["after_discovery"] == []
    assert "ddpw_conf.store" in report["after_compose"] and "torch" not in report["after_compose"]
    assert report["launcher"] == LocalLauncherConf._target_


def test_the_source_names_every_launcher_option_there_is() -> None:
    assert LAUNCHER_OPTIONS == OPTIONS


@pytest.fixture
def conf_dir() -> Iterator[None]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        yield
    GlobalHydra.instance().clear()


@pytest.mark.usefixtures("conf_dir")
@pytest.mark.parametrize("option", LAUNCHER_OPTIONS)
def test_each_option_brings_a_whole_platform_and_its_launcher_options(option: str) -> None:
    ending, key = OWN_PLATFORM
    cfg = compose(config_name="config", overrides=[f"hydra/launcher={option}"], return_hydra_config=True)
    node = key if option.endswith(ending) else "platform"  # the twin brings it where an app's own cannot be
    # A plain mapping (an app's own `platform` merges with it, and the launcher's check names the collision)
    # with every field of the launcher's Platform.
    assert OmegaConf.get_type(cfg, node) is dict and cfg.hydra.launcher.platform_key == node
    platform = LAUNCHERS[option.removesuffix(ending)][1]
    assert set(cfg[node]) == set(dataclasses.asdict(platform)) and cfg[node].device == platform.device
    # The launcher's options: a plain mapping too (a value of the wrong type reaches the launcher's own check), with
    # every option of its schema, read into that schema by what every launcher reads its options with.
    schema = SlurmLauncherConf if option.startswith("ddpw_slurm") else LocalLauncherConf
    assert OmegaConf.get_type(cfg.hydra, "launcher") is dict
    assert set(cfg.hydra.launcher) == {f.name for f in dataclasses.fields(schema)}
    options = selected_options(cfg.hydra.launcher)
    assert isinstance(options, schema) and options.platform_of(cfg).device == platform.device
    assert "ddpw_plain_run" in cfg.hydra.callbacks


@pytest.mark.usefixtures("conf_dir")
def test_a_platform_value_of_the_wrong_type_is_refused_by_the_launchers_check() -> None:
    cfg = compose(config_name="config", overrides=["hydra/launcher=ddpw_cpu", "platform.n_nodes=two"],
                  return_hydra_config=True)
    options = selected_options(cfg.hydra.launcher)
    assert isinstance(options, LocalLauncherConf)
    with pytest.raises(ConfigError, match=r"platform.n_nodes='two': use an integer >= 1"):
        check(options.platform_of(cfg))


@pytest.mark.usefixtures("conf_dir")
def test_a_launcher_option_of_the_wrong_type_composes_and_is_refused_by_the_launchers_check() -> None:
    """Not OmegaConf's "could not be converted to Float" as the override merges, which names no fix."""
    cfg = compose(config_name="config", overrides=["hydra/launcher=ddpw_cpu", "hydra.launcher.stop_grace_s=soon"],
                  return_hydra_config=True)
    with pytest.raises(ConfigError, match=r"hydra.launcher.stop_grace_s='soon': use a number of seconds >= 0"):
        selected_options(cfg.hydra.launcher)


@pytest.mark.usefixtures("conf_dir")
def test_a_key_the_platform_does_not_have_composes_and_its_check_names_the_nearest_one() -> None:
    """Not Hydra's "To append to your config use +", which that check would then refuse: the node is not in struct
    mode, so the key reaches the check (as a launcher runs it, or `platform_from_config` with the compose API)."""
    cfg = compose(config_name="config", overrides=["hydra/launcher=ddpw_cpu", "platform.n_node=2"])
    with pytest.raises(ConfigError, match="platform.n_node=2: Platform has no such field; did you mean n_nodes?"):
        platform_from_config(cfg.platform)


@pytest.mark.usefixtures("conf_dir")
def test_each_load_is_a_fresh_config() -> None:
    first = compose(config_name="config", overrides=["hydra/launcher=ddpw_cpu", "platform.n_nodes=3"])
    second = compose(config_name="config", overrides=["hydra/launcher=ddpw_cpu"])
    assert first.platform.n_nodes == 3 and second.platform.n_nodes == 1


@pytest.mark.usefixtures("conf_dir")
def test_hydra_lists_the_options() -> None:
    options = GlobalHydra.instance().config_loader().get_group_options("hydra/launcher")
    assert set(LAUNCHER_OPTIONS) <= set(options) and "basic" in options


def test_a_defaults_list_written_for_hydra_ddpw_0_1_still_composes(tmp_path: Path) -> None:
    (tmp_path / "old.yaml").write_text("defaults:\n  - ddpw\n  - _self_\n\nlr: 0.1\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            assert OmegaConf.to_container(compose(config_name="old")) == {"lr": 0.1}
    finally:
        GlobalHydra.instance().clear()
