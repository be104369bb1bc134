"""Registers hydra-ddpw's configs when Hydra discovers its plugins (cheap: no torch)."""

from ddpw_conf import register_configs

register_configs()
