"""Structured configs of hydra-ddpw: `Platform`, `Device`, launcher options; never imports torch."""

import sys

from ddpw_conf.errors import ConfigError
from ddpw_conf.launcher import LocalLauncherConf, SlurmLauncherConf
from ddpw_conf.layout import Layout
from ddpw_conf.platform import Device, Platform, platform_from_config

__all__ = [
    "ConfigError",
    "Device",
    "Layout",
    "LocalLauncherConf",
    "SlurmLauncherConf",
    "Platform",
    "platform_from_config",
]

if "--experimental-rerun" in sys.argv:
    # Hydra's rerun calls the task without any callback; the pickled config of a ddpw job imports this
    # package (its `platform` node is a `Platform`), which is the one moment to make the rerun run the
    # job again as a distributed job (see ddpw_runtime/hydra_jobs/rerun.py).
    from ddpw_runtime.hydra_jobs.rerun import install

    install()
