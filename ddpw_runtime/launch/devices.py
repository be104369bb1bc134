"""This machine's devices, shared out among jobs side by side: each gets GPUs and CPU cores of its own (`Share`), or
the whole machine when it does not say how much it needs; a fixed `platform.master_port` is one job's at a time."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddpw_conf import Device, Platform


@dataclass(frozen=True)
class Share:
    """The devices one job may use while other jobs run beside it."""

    gpus: tuple[str, ...] | None = None
    """Its GPUs, as `CUDA_VISIBLE_DEVICES` names them (None: whatever the job would see alone)."""
    cpus: tuple[int, ...] | None = None
    """Its CPU cores, as `os.sched_setaffinity` takes them (None: every core this program may use)."""
    n_cpus: int | None = None
    """How many cores its ranks' threads count on (None: the machine's): its `cpus`, or when it shares every core (a GPU
    job without `n_cpus_per_node`) its part of them, as its part of the GPUs."""
    whole: bool = False
    """It has the whole machine (nothing runs beside it)."""
    port: int | None = None
    """The fixed rendezvous port it holds, which no job beside it may use."""


@dataclass(frozen=True)
class Need:
    """What one job takes from the machine."""

    gpus: int = 0
    cpus: int = 0
    """Cores of its own (0: it shares every core, as a GPU job without `n_cpus_per_node`)."""
    whole: bool = False
    """It takes the whole machine (a CPU job without `n_cpus_per_node`, an MPS job)."""
    port: int | None = None
    """The fixed rendezvous port it listens on (None: a free port, or a `file` rendezvous)."""

    @staticmethod
    def of(platform: Platform) -> Need:
        """What a job of `platform` takes."""
        port = platform.master_port if platform.ipc_protocol == "tcp" else None
        if platform.device_kind is Device.MPS or (not platform.uses_gpus and platform.n_cpus_per_node is None):
            return Need(whole=True, port=port)
        return Need(gpus=platform.n_gpus_per_node if platform.uses_gpus else 0, cpus=platform.n_cpus_per_node or 0,
                    port=port)


def cpu_cores() -> tuple[int, ...]:
    """The CPU cores this program may run on (its affinity, which a container or `taskset` narrows)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def visible_gpus(count: int) -> tuple[str, ...]:
    """This machine's `count` GPUs as `CUDA_VISIBLE_DEVICES` names them (the caller's entries if set, else indexes)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return tuple([name.strip() for name in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if name.strip()][:count])
    return tuple(str(index) for index in range(count))


class Devices:
    """The devices of this machine that jobs running side by side take and give back."""

    def __init__(self, gpus: tuple[str, ...], cpus: tuple[int, ...]) -> None:
        self.gpus = gpus
        self.cpus = cpus
        self._free_gpus = list(gpus)
        self._free_cpus = list(cpus)
        self._taken: list[Share] = []

    def take(self, need: Need) -> Share | None:
        """Devices for a job that needs `need`, or None while they (or its fixed port) are not free."""
        if any(share.whole for share in self._taken) or (need.whole and self._taken):
            return None
        if need.port is not None and any(share.port == need.port for share in self._taken):
            return None
        if need.whole:
            share = Share(whole=True, port=need.port)
        elif need.gpus > len(self._free_gpus) or need.cpus > len(self._free_cpus):
            return None
        else:
            gpus, self._free_gpus = self._free_gpus[:need.gpus], self._free_gpus[need.gpus:]
            cpus, self._free_cpus = self._free_cpus[:need.cpus], self._free_cpus[need.cpus:]
            if need.cpus:
                share = Share(tuple(gpus) if need.gpus else None, tuple(cpus), need.cpus, port=need.port)
            else:
                share = Share(tuple(gpus), None, max(1, len(self.cpus) * need.gpus // len(self.gpus)), port=need.port)
        self._taken.append(share)
        return share

    def give_back(self, share: Share) -> None:
        """The job that had `share` ended."""
        self._taken.remove(share)
        self._free_gpus = [gpu for gpu in self.gpus if gpu in {*self._free_gpus, *(share.gpus or ())}]
        self._free_cpus = [cpu for cpu in self.cpus if cpu in {*self._free_cpus, *(share.cpus or ())}]
