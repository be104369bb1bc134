"""Hydra's global state (HydraConfig, the config store, resolvers...) carried from the controller into
the ranks, which then see the job as the controller does (`HydraConfig.get()`, interpolations).

It is `Singleton.get_state()` / `Singleton.set_state()`, minus two costs that add up in every short
job: the deep copy `get_state` makes before the state is pickled (pickling copies it anyway), and the
discovery of every Hydra plugin that `set_state` repeats in each rank (a rank forked from the
controller has the plugin registry already).
"""

from __future__ import annotations

import cloudpickle
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
from omegaconf.basecontainer import BaseContainer


def pack() -> bytes:
    """This process's Hydra state, pickled (the plugin registry left out, as `get_state` does)."""
    instances = {cls: instance for cls, instance in Singleton._instances.items() if cls is not Plugins}
    return cloudpickle.dumps({"instances": instances, "omegaconf_resolvers": BaseContainer._resolvers})


def restore(state: bytes) -> None:
    """Make `state` (from `pack`) this process's Hydra state, keeping its plugin registry if it has one."""
    unpacked = cloudpickle.loads(state)
    unpacked["instances"][Plugins] = Plugins.instance()
    Singleton.set_state(unpacked)
