"""Runs a function as a PyTorch distributed job (`from ddpw_runtime import Platform, Wrapper, wrapper`), and the
helpers a task uses inside a rank. Importing this package never imports torch; the helpers import it when called."""

from ddpw_conf import ConfigError, Device, Layout, Platform
from ddpw_runtime.errors import JobTimedOut, RankFailure, SlurmJobError, Terminated
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.rank.collectives import all_to_all, average
from ddpw_runtime.rank.context import (
    barrier,
    device,
    group,
    is_main,
    local_rank,
    mesh,
    node_rank,
    platform,
    rank,
    rank_zero_only,
    restart_count,
    run_id,
    world_size,
)
from ddpw_runtime.rank.data import distributed_sampler, to_device
from ddpw_runtime.rank.ddp import no_sync, unwrap_model, wrap_model
from ddpw_runtime.wrapper import Wrapper, wrapper

__all__ = [
    "ConfigError", "Device", "JobTimedOut", "Layout", "Platform", "RankFailure", "RankResult", "SlurmJobError",
    "Terminated", "Wrapper", "all_to_all", "average", "barrier", "device", "distributed_sampler", "group", "is_main",
    "local_rank", "mesh", "no_sync", "node_rank", "platform", "rank", "rank_zero_only", "restart_count", "run_id",
    "to_device", "unwrap_model", "world_size", "wrap_model", "wrapper"
]
