"""Tells Hydra, when it discovers plugins, where hydra-ddpw's launcher options are: a search path entry
and the config source behind it (`_options_source.py`); their configs are made only when an app loads one."""

from hydra_plugins.hydra_ddpw_launcher._options_source import LauncherOptionsSearchPath, LauncherOptionsSource

__all__ = ["LauncherOptionsSearchPath", "LauncherOptionsSource"]
