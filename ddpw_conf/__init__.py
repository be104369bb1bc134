"""Structured configs of hydra-ddpw: `Platform`, `Device`, `Layout`; never imports torch. The launcher options
are in `ddpw_conf.launcher` (a script that only uses `Wrapper` does not import them)."""

from ddpw_conf.errors import ConfigError
from ddpw_conf.layout import Layout
from ddpw_conf.platform import Device, Platform, platform_from_config

__all__ = ["ConfigError", "Device", "Layout", "Platform", "platform_from_config"]
