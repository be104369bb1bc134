"""Runs a function as a PyTorch distributed job, and the helpers a task uses inside a rank."""

from ddpw_conf import ConfigError, Device, Platform
from ddpw_runtime.context import barrier, device, group, is_main, local_rank, node_rank, rank, world_size
from ddpw_runtime.results import RankFailure, RankResult

__all__ = [
    "ConfigError",
    "Device",
    "Platform",
    "RankFailure",
    "RankResult",
    "barrier",
    "device",
    "group",
    "is_main",
    "local_rank",
    "node_rank",
    "rank",
    "world_size",
]
