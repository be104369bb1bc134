"""The configs of the launcher options (`hydra/launcher=ddpw_*`, package `_global_`), made when an app loads one
through the plugin's config source (docs/architecture.md, "Hydra"); the empty `ddpw` node is what configs written for
hydra-ddpw 0.1 list in their defaults."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from ddpw_conf.launcher import OWN_PLATFORM, PLATFORM_KEY, LocalLauncherConf, SlurmLauncherConf
from ddpw_conf.platform import Platform

if TYPE_CHECKING:
    from omegaconf import DictConfig

_PLAIN_RUN = "ddpw_runtime.procs.plain_run.PlainRun"
LAUNCHERS: dict[str, tuple[Any, Platform, str]] = {
    "ddpw_cpu": (LocalLauncherConf, Platform(device="cpu"), _PLAIN_RUN),
    "ddpw_gpu": (LocalLauncherConf, Platform(device="gpu", n_gpus_per_node=1), _PLAIN_RUN),
    "ddpw_mps": (LocalLauncherConf, Platform(device="mps"), _PLAIN_RUN),
    "ddpw_slurm": (SlurmLauncherConf, Platform(device="slurm", n_gpus_per_node=1),
                   "ddpw_runtime.slurm.plain_run.SlurmPlainRun"),
}
"""Each launcher option: its options schema, the `platform` node it brings, its plain-run callback."""

OPTIONS = (*LAUNCHERS, *(name + OWN_PLATFORM[0] for name in LAUNCHERS))
"""Every `hydra/launcher` option: each of `LAUNCHERS`, and its twin for apps with a `platform` of their own."""


def option_config(name: str) -> DictConfig:
    """A fresh copy of the config of `name` (`ddpw` or one of `OPTIONS`); its nodes are plain mappings."""
    return copy.deepcopy(_made(name))


@functools.cache
def _made(name: str) -> DictConfig:
    from omegaconf import OmegaConf

    if name == "ddpw":
        return OmegaConf.create({})
    ending, own_key = OWN_PLATFORM
    conf, platform, callback = LAUNCHERS[name.removesuffix(ending)]
    key = own_key if name.endswith(ending) else PLATFORM_KEY
    # The platform and launcher nodes are plain mappings, not `Platform` and the options' dataclass, so that a value of
    # the wrong type reaches hydra-ddpw's own check: docs/architecture.md ("Hydra") says why.
    made = OmegaConf.structured({
        "hydra": {"launcher": dataclasses.asdict(conf(platform_key=key)), "callbacks": {
            "ddpw_plain_run": {"_target_": callback},
            "ddpw_sweep_summary": {"_target_": "ddpw_runtime.hydra_jobs.sweep_summary.PrintSweepSummary"},
        }},
        key: dataclasses.asdict(platform),
    })
    for node in (made[key], made.hydra.launcher):  # a key it lacks, typed without `+`, reaches its own check
        OmegaConf.set_struct(node, False)
    return made
