"""Registration of the schemas, presets and launcher options in Hydra's ConfigStore."""

from __future__ import annotations

from typing import Any, Dict

from hydra.core.config_store import ConfigStore

from ddpw_conf.launcher import LocalLauncherConf, SlurmLauncherConf
from ddpw_conf.platform import Platform
from ddpw_conf.run_mode import RUN_MODE_NODE, register_resolvers

PRESETS: Dict[str, Platform] = {
    "cpu": Platform(device="cpu"),
    "gpu": Platform(device="gpu", n_gpus_per_node=1),
    "mps": Platform(device="mps"),
    "slurm": Platform(device="slurm", n_gpus_per_node=1),
}
"""Platform presets by name: the default `platform` node each launcher option brings."""

PRESET_FIELDS = ("device", "n_gpus_per_node")
"""The fields a `platform=<name>` option sets. Only these: an option selected with `+platform=gpu` is
merged after the primary config, and a whole Platform would reset every field set there; the schema
(type checking) comes from the launcher option's `platform` node, which is merged first."""


def preset_option(name: str) -> Dict[str, Any]:
    """The `platform=<name>` config group option: the preset's `PRESET_FIELDS`."""
    return {key: getattr(PRESETS[name], key) for key in PRESET_FIELDS}

LOCAL_LAUNCHERS = {"ddpw_cpu": "cpu", "ddpw_gpu": "gpu", "ddpw_mps": "mps"}
"""Local launcher options and the platform preset each brings as the default `platform` node."""

SLURM_LAUNCHERS = {"ddpw_slurm": "slurm"}
"""SLURM launcher options and the platform preset each brings as the default `platform` node."""

RUN_MODE_CHECK = {"ddpw_run_mode_check": {"_target_": "ddpw_conf.run_mode.RunModeCheck"}}


def launcher_node(launcher: Any, preset: str) -> Dict[str, Any]:
    """A `hydra/launcher` option (package `_global_`): the launcher, its run-mode check and a default
    `platform`, so `platform.*` overrides need no `+` even when the user config has no platform."""
    return {
        "hydra": {"launcher": launcher, "callbacks": RUN_MODE_CHECK},
        "platform": PRESETS[preset],
    }


def register_configs() -> None:
    """Register everything; safe to call more than once."""
    register_resolvers()
    store = ConfigStore.instance()
    store.store(name="ddpw", node=RUN_MODE_NODE, package="_global_", provider="hydra-ddpw")
    for name in PRESETS:
        store.store(group="platform", name=name, node=preset_option(name), provider="hydra-ddpw")
    launchers = [(LocalLauncherConf, LOCAL_LAUNCHERS), (SlurmLauncherConf, SLURM_LAUNCHERS)]
    for conf, options in launchers:
        for name, preset in options.items():
            store.store(
                group="hydra/launcher",
                name=name,
                node=launcher_node(conf, preset),
                package="_global_",
                provider="hydra-ddpw",
            )
