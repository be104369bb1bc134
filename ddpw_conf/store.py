"""Registration of the launcher options in Hydra's ConfigStore.

Each launcher option (`hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps|ddpw_slurm`, package `_global_`) brings
everything a repo that knows nothing of hydra-ddpw needs: the launcher, the callback that makes a plain
run start the ranks (`ddpw_runtime.hydra_jobs.plain_run`), and a default `platform` node (a whole
`Platform`, that launcher's device), so `platform.n_gpus_per_node=4` needs no `+` and a repo's own
`platform` presets are type-checked. An app whose config has a `platform` key of its own (Hydra refuses
to merge it into a `Platform`) selects the twin option `ddpw_*_own_platform`, which brings the node as
`ddpw_platform` and tells the launcher to read it there (`hydra.launcher.platform_key`). Nothing else is
registered where apps that do not select a ddpw launcher would see it (no `platform` config group),
except the empty `ddpw` node, which configs written for hydra-ddpw 0.1 list in their defaults.
"""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore

from ddpw_conf.launcher import PLATFORM_KEY, LocalLauncherConf, SlurmLauncherConf
from ddpw_conf.platform import Platform

LAUNCHERS: dict[str, tuple[Any, Platform, str]] = {
    "ddpw_cpu": (LocalLauncherConf, Platform(device="cpu"), "ddpw_runtime.hydra_jobs.plain_run.PlainRun"),
    "ddpw_gpu": (LocalLauncherConf, Platform(device="gpu", n_gpus_per_node=1),
                 "ddpw_runtime.hydra_jobs.plain_run.PlainRun"),
    "ddpw_mps": (LocalLauncherConf, Platform(device="mps"), "ddpw_runtime.hydra_jobs.plain_run.PlainRun"),
    "ddpw_slurm": (SlurmLauncherConf, Platform(device="slurm", n_gpus_per_node=1),
                   "ddpw_runtime.slurm.plain_run.SlurmPlainRun"),
}
"""Each launcher option: its options schema, the `platform` node it brings, its plain-run callback."""

CALLBACK_KEY = "ddpw_plain_run"
"""The key of the plain-run callback under `hydra.callbacks`."""
OWN_PLATFORM = ("_own_platform", "ddpw_platform")
"""The twin of each launcher option for apps with a `platform` of their own: its name's ending, and the
key it brings the platform node under."""
SUMMARY_CALLBACK = {"ddpw_sweep_summary": {"_target_": "ddpw_runtime.hydra_jobs.sweep_summary.PrintSweepSummary"}}
"""The callback that prints a multirun's summary when it ends."""


def launcher_node(launcher: Any, platform: Platform, callback: str, key: str = PLATFORM_KEY) -> dict[str, Any]:
    """A `hydra/launcher` option (package `_global_`) that brings the platform node as `key`."""
    return {
        "hydra": {"launcher": launcher(platform_key=key),
                  "callbacks": {CALLBACK_KEY: {"_target_": callback}, **SUMMARY_CALLBACK}},
        key: platform,
    }


def register_configs() -> None:
    """Register everything; safe to call more than once."""
    store = ConfigStore.instance()
    store.store(name="ddpw", node={}, package="_global_", provider="hydra-ddpw")
    ending, key = OWN_PLATFORM
    for name, (conf, platform, callback) in LAUNCHERS.items():
        for option, node in ((name, launcher_node(conf, platform, callback)),
                             (name + ending, launcher_node(conf, platform, callback, key))):
            store.store(group="hydra/launcher", name=option, node=node, package="_global_", provider="hydra-ddpw")
