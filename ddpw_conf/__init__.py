"""Structured configs of hydra-ddpw: `Platform`, `Device`, launcher options; never imports torch."""

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

