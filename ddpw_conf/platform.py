"""The `Platform` schema (where and how many ranks a job runs, and how they talk) and every check of it; no torch."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from enum import Enum
from typing import Any

from ddpw_conf.errors import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_known,
    check_match,
    check_number,
    is_int,
    number_as_text,
)
from ddpw_conf.layout import Layout, layout_from_config

START_METHODS = ("forkserver", "spawn")
IPC_PROTOCOLS = ("tcp", "file")
BACKENDS = ("gloo", "nccl", "mpi")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9_.:-]{0,252}")  # (`:` first: IPv6, such as ::1)
_SLURM_KEY = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*([.:][A-Za-z_]\w*)")
_KEY_PARTS = re.compile(r"[.\[\]]+")
MAX_WORLD_SIZE = 4096
MAX_TIMEOUT_MIN = 100 * 365 * 24 * 60
"""The longest timeout and grace (100 years): torch adds a timeout to the time since 1970 in nanoseconds, a signed
64-bit count that overflows in 2262 (past it, with torch 2.13, collectives hang or fail at once); the launcher's own
waits and SLURM's time limit (minutes, 32 bits) end below that too."""


def check_duration(key: str, value: Any, fix: str, unit: str = "minutes", positive: bool = True) -> None:
    """Raise `ConfigError` unless `value` is a number of `unit` > 0 (>= 0 unless `positive`) up to `MAX_TIMEOUT_MIN`."""
    check_number(key, value, fix, positive)
    if value > (most := MAX_TIMEOUT_MIN * (60 if unit == "seconds" else 1)):
        raise ConfigError(key, value, f"use at most {most} {unit} (100 years): torch and the launcher add it to clocks "
                          "that overflow beyond that")


class Device(Enum):
    """The kind of device each rank computes on."""

    CPU = "cpu"
    GPU = "gpu"
    MPS = "mps"
    SLURM = "slurm"
    """Ranks on SLURM nodes: one GPU per rank when `n_gpus_per_node` > 0, else CPU."""

    @staticmethod
    def from_str(value: str | Device) -> Device:
        """The Device named by `value` (case-insensitive; `cuda` is a synonym for `gpu`)."""
        if isinstance(value, Device):
            return value
        name = str(value).strip().lower()
        name = "gpu" if name == "cuda" else name
        if name not in {d.value for d in Device}:
            raise ConfigError("platform.device", value, f"choose one of {', '.join(d.value for d in Device)}")
        return Device(name)


_RENAMED = {"ram": "mem_per_node"}
"""Fields of the `ddpw` package's `Platform` (5.x) that no guess finds here, by the field that does the same."""


@dataclass
class Platform:
    """Where a distributed job runs and how its ranks are laid out. Field names follow the `ddpw` package's Platform,
    plus `n_procs_per_node` (ranks per node) and `console_ranks` (whose output the console shows)."""

    name: str = "ddpw"
    device: str = "cpu"
    partition: str | None = None
    """SLURM partition; None: the cluster's default partition (no `--partition` line)."""
    n_nodes: int = 1
    n_gpus_per_node: int = 0
    n_procs_per_node: int | None = None
    n_cpus_per_node: int | None = None
    mem_per_node: int = 0
    spawn_method: str = "forkserver"
    ipc_protocol: str = "tcp"
    master_addr: str | None = None
    """Where the ranks meet: node 0's address. None: loopback on one node; across machines, what the platform the
    node runs on says (docs/multi-node.md)."""
    master_port: int | None = None
    """The rendezvous port. None: a free one on one node; across machines, what the platform says, else 29500."""
    node_rank: int | None = None
    """This machine's node in a job across machines without SLURM (0 hosts the rendezvous). None: what the platform
    the node runs on says."""
    join_timeout_min: float = 10
    """How long the nodes of a job across machines wait for each other (torchrun's rendezvous join timeout)."""
    ipc_groups: list[list[int]] | None = field(default_factory=list)
    """Partition of the ranks into groups (`[]`: the world only); None: hydra-ddpw makes no process group and the
    task makes its own (`init_process_group()`, as under torchrun)."""
    backend: str | None = None
    seed: int = 1889
    timeout_min: float = 2880
    collective_timeout_min: float = 30
    stall_timeout_min: float | None = None
    """How long the job may go without a rank writing a line or moving (its Python stack) before the console says
    where each rank is, once per stall; None: never."""
    stop_on_stall: bool = False
    """Stop a stalled job (`JobTimedOut`) instead of going on after the report."""
    exit_timeout_min: float = 1
    """How long a rank whose task returned may take to exit (its `atexit` handlers, such as a tracker's upload, and
    closing the files its task left open) before it is ended and the job fails (`HungAtExit`)."""
    slurm_additional_parameters: dict[str, Any] = field(default_factory=dict)
    console_logs: bool = True
    console_ranks: Any = field(default_factory=lambda: [0])
    verbose: bool = True
    upon_finish: str | None = None
    layout: Layout = field(default_factory=Layout)
    """Data / tensor / pipeline parallel sizes; the default is every rank data-parallel."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Platform:
        """A `ConfigError` naming the nearest field for an unknown keyword (not a dataclass's `TypeError`)."""
        check_known("platform.", kwargs, {f.name for f in fields(cls)}, "Platform", renamed=_RENAMED)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        """Accept `layout` as a mapping too (`Platform(layout={"tensor": 2})`), and a device named in any case or as
        `cuda` (or a `Device`), kept as its own name (`CPU`: `cpu`), so it is shown and compared as that."""
        if isinstance(self.device, (str, Device)):
            with contextlib.suppress(ConfigError):  # (a name that is no device: `validate` refuses it)
                self.device = Device.from_str(self.device).value
        if not isinstance(self.layout, Layout):
            self.layout = layout_from_config(self.layout)

    @property
    def device_kind(self) -> Device:
        """`device` as a `Device`."""
        return Device.from_str(self.device)

    @property
    def uses_gpus(self) -> bool:
        """Whether each rank is bound to a CUDA GPU."""
        kind, gpus = self.device_kind, self.n_gpus_per_node
        # `is_int` first: this runs before `validate` (the engine counts GPUs), so a bad count must reach
        # `validate`'s ConfigError rather than fail here with a TypeError.
        return kind is Device.GPU or (kind is Device.SLURM and is_int(gpus) and gpus > 0)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node: `n_procs_per_node`, or one per GPU on GPU devices, else 1."""
        if self.n_procs_per_node is not None:
            return self.n_procs_per_node
        return self.n_gpus_per_node if self.uses_gpus else 1

    @property
    def world_size(self) -> int:
        """Number of ranks in the whole job."""
        return self.n_nodes * self.ranks_per_node

    @property
    def requires_ipc(self) -> bool:
        """Whether the ranks need a process group (more than one rank)."""
        return self.world_size > 1

    @property
    def resolved_backend(self) -> str:
        """`backend`, or the automatic choice: nccl on CUDA GPUs, gloo otherwise."""
        return self.backend or ("nccl" if self.uses_gpus else "gloo")

    def shown_ranks(self) -> list[int]:
        """The global ranks whose output is echoed on the console."""
        if not self.console_logs:
            return []
        if isinstance(self.console_ranks, str):
            return list(range(self.world_size))
        return sorted({int(r) for r in self.console_ranks})

    def summary(self) -> str:
        """A readable summary of the platform, one `key : value` per line."""
        rows = [(f.name, getattr(self, f.name)) for f in fields(self)]
        rows += [("world_size", self.world_size), ("backend (resolved)", self.resolved_backend)]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)} : {v}" for k, v in rows)

    def print(self) -> None:
        """Print `summary()`."""
        print(self.summary())

    def validate(self, gpus_available: int | None = None) -> Platform:
        """Check every field (`ConfigError`); `gpus_available`: this node's CUDA GPUs, when known. Returns self."""
        self._validate_names()
        kind = self.device_kind
        if kind is Device.GPU and gpus_available == 0:  # first: no count of GPUs can make it run here
            if self.backend == "nccl":  # blame the key the user set: an explicit backend=nccl, else device=gpu
                raise ConfigError("platform.backend", "nccl", "CUDA is not available on this machine (no GPU found) "
                                  "and nccl needs CUDA GPUs; use platform.device=cpu with backend=gloo (or unset)")
            raise ConfigError("platform.device", self.device, "CUDA is not available on this machine (no GPU found); "
                              "use platform.device=cpu (hydra/launcher=ddpw_cpu)")
        self._validate_counts(kind)
        self._validate_choices()
        self._validate_groups()
        self._validate_slurm_parameters()
        for key in ("console_logs", "verbose", "stop_on_stall"):
            check_bool(f"platform.{key}", getattr(self, key))
        if self.stop_on_stall and self.stall_timeout_min is None:
            raise ConfigError("platform.stop_on_stall", self.stop_on_stall, "a job counts as stalled only with "
                              "platform.stall_timeout_min set; set it too (such as 30), or stop_on_stall=false")
        self.layout.validate(self.world_size)
        if self.resolved_backend == "nccl" and not self.uses_gpus:
            raise ConfigError("platform.backend", "nccl", "nccl needs CUDA GPUs; use backend=gloo (or leave it "
                              "unset) on cpu/mps, or device=gpu with n_gpus_per_node >= 1")
        if kind is Device.GPU and gpus_available is not None and self.n_gpus_per_node > gpus_available:
            raise ConfigError("platform.n_gpus_per_node", self.n_gpus_per_node, f"this machine has {gpus_available} "
                              "CUDA GPU(s); ask for at most that many, or use platform.device=cpu")
        return self

    def validate_local(self) -> None:
        """Raise `ConfigError` unless every rank can run on this machine (one node), as a `Wrapper` runs them."""
        self.validate_not_slurm("a Wrapper")
        if self.n_nodes > 1:
            raise ConfigError("platform.n_nodes", self.n_nodes, "a Wrapper runs every rank on this machine; use "
                              "n_nodes=1 (a job across machines runs from a Hydra app: hydra/launcher=ddpw_cpu or "
                              "ddpw_gpu on every machine, docs/multi-node.md, or hydra/launcher=ddpw_slurm)")

    def validate_not_slurm(self, runner: str) -> None:
        """Raise `ConfigError` for `device: slurm` where `runner` (`a Wrapper`, a local launcher) starts the ranks
        itself, on this machine: nothing would be submitted to SLURM."""
        if self.device_kind is Device.SLURM:
            raise ConfigError("platform.device", self.device, f"{runner} runs the ranks on this machine and submits "
                              "nothing to SLURM; use platform.device=cpu, gpu or mps here, or submit to SLURM nodes "
                              "with python train.py -m hydra/launcher=ddpw_slurm")

    def _validate_names(self) -> None:
        check_match("platform.name", self.name, _NAME, "use 1-128 letters, digits, '_', '.', '+' or '-', "
                    "starting with a letter or digit")
        check_match("platform.partition", self.partition, _NAME, "use a SLURM partition name: 1-128 letters, "
                    "digits, '_', '.', '+' or '-', starting with a letter or digit; or null for the cluster's "
                    "default partition", optional=True)
        check_match("platform.upon_finish", self.upon_finish, _IMPORT_PATH, "give an import path such as "
                    "'my_package.module:function' (or 'my_package.module.function')", optional=True)

    def _validate_counts(self, kind: Device) -> None:
        check_int("platform.n_nodes", self.n_nodes, 1)
        check_int("platform.n_gpus_per_node", self.n_gpus_per_node, 0)
        check_int("platform.n_procs_per_node", self.n_procs_per_node, 1, optional=True)
        if kind in (Device.CPU, Device.MPS) and self.n_gpus_per_node:
            raise ConfigError("platform.n_gpus_per_node", self.n_gpus_per_node, f"device={kind.value} runs every rank "
                              f"on {kind.value.upper()} and uses no GPU; set n_gpus_per_node=0 (n_procs_per_node sets "
                              "the ranks), or use device=gpu (hydra/launcher=ddpw_gpu) for a rank per GPU")
        if kind is Device.GPU and self.n_gpus_per_node < 1:
            raise ConfigError("platform.n_gpus_per_node", self.n_gpus_per_node,
                              "device=gpu needs at least one GPU per node; set n_gpus_per_node >= 1 or use device=cpu")
        if kind is Device.MPS and self.n_nodes > 1:
            raise ConfigError("platform.n_nodes", self.n_nodes, "device=mps runs on this machine only; use n_nodes=1, "
                              "or device=cpu or gpu across machines")
        check_int("platform.node_rank", self.node_rank, 0, " or null (what the platform the node runs on says)",
                  optional=True)
        if self.node_rank is not None and self.node_rank >= self.n_nodes:
            raise ConfigError("platform.node_rank", self.node_rank, f"nodes are numbered 0..{self.n_nodes - 1} "
                              f"(platform.n_nodes={self.n_nodes}); use one of those, or null")
        if self.uses_gpus and self.ranks_per_node > self.n_gpus_per_node:
            raise ConfigError("platform.n_procs_per_node", self.n_procs_per_node, "each rank needs its own GPU "
                              f"and only n_gpus_per_node={self.n_gpus_per_node} are asked for; lower n_procs_per_node "
                              "or raise n_gpus_per_node")
        check_int("platform.n_cpus_per_node", self.n_cpus_per_node, 1, optional=True)
        if self.n_cpus_per_node is not None and self.n_cpus_per_node % self.ranks_per_node:
            raise ConfigError("platform.n_cpus_per_node", self.n_cpus_per_node, f"must be a multiple of the "
                              f"{self.ranks_per_node} rank(s) per node so each rank gets the same number of CPUs")
        check_int("platform.mem_per_node", self.mem_per_node, 0)
        for key in ("timeout_min", "collective_timeout_min", "stall_timeout_min", "join_timeout_min",
                    "exit_timeout_min"):
            if (value := getattr(self, key)) is not None or key != "stall_timeout_min":
                check_duration(f"platform.{key}", value, "use a positive number of minutes, such as 60 or 0.5")
        if timedelta(minutes=self.collective_timeout_min) < timedelta(milliseconds=1):
            raise ConfigError("platform.collective_timeout_min", self.collective_timeout_min, "torch counts this "
                              "timeout in whole milliseconds and this is less than one, so every wait would fail at "
                              f"once; use at least {1 / 60000:.7f} minutes (1 ms), such as 30")
        if not is_int(self.seed) or not 0 <= self.seed < 2**32:
            raise ConfigError("platform.seed", self.seed, f"use an integer in 0..4294967295{number_as_text(self.seed)}")
        if self.world_size > MAX_WORLD_SIZE:
            # Name the key that made the world too big: what sets ranks per node, else n_nodes.
            key = ("n_nodes" if self.ranks_per_node <= MAX_WORLD_SIZE
                   else "n_gpus_per_node" if self.n_procs_per_node is None else "n_procs_per_node")
            raise ConfigError(f"platform.{key}", getattr(self, key), f"a world of {self.world_size} ranks is beyond "
                              f"what this launcher supports; keep n_nodes * ranks per node <= {MAX_WORLD_SIZE}")

    def _validate_choices(self) -> None:
        check_choice("platform.spawn_method", self.spawn_method, START_METHODS)
        check_choice("platform.ipc_protocol", self.ipc_protocol, IPC_PROTOCOLS)
        if self.backend is not None:
            check_choice("platform.backend", self.backend, BACKENDS,
                         ", or leave it unset (null) for the automatic choice")
        if self.ipc_protocol == "file" and self.n_nodes > 1:
            raise ConfigError("platform.ipc_protocol", "file", "a file rendezvous works on one node only; use tcp")
        ranks = self.console_ranks
        if ranks != "all" and (not isinstance(ranks, (list, tuple)) or not all(is_int(r) for r in ranks)):
            raise ConfigError("platform.console_ranks", ranks, "use 'all' or a list of ranks such as [0, 1]")
        if ranks != "all" and (outside := [r for r in ranks if not 0 <= r < self.world_size]):
            raise ConfigError("platform.console_ranks", list(ranks),
                              f"rank(s) {outside} are outside {self._world_text()}")
        if self.master_port is not None and (not is_int(self.master_port) or not 1 <= self.master_port <= 65535):
            raise ConfigError("platform.master_port", self.master_port, "use a port in 1..65535, or leave it unset "
                              f"(null) to pick a free port per job{number_as_text(self.master_port)}")
        check_match("platform.master_addr", self.master_addr, _HOST,
                    "use a host name or IP address, or leave it unset (null) for the automatic choice", optional=True)

    def _validate_groups(self) -> None:
        groups = self.ipc_groups
        if groups is None:  # the task makes the process group itself, through env://; no layout mesh is built
            if self.ipc_protocol != "tcp":
                raise ConfigError("platform.ipc_protocol", self.ipc_protocol, "with ipc_groups=null the task "
                                  "makes its own process group through env:// (MASTER_ADDR, MASTER_PORT), which "
                                  "needs ipc_protocol=tcp")
            if not self.layout.is_data_only:
                raise ConfigError("platform.ipc_groups", None, "a platform.layout with tensor or pipeline above 1 "
                                  "needs the process group that hydra-ddpw makes: use ipc_groups=[] (or leave the "
                                  "layout unset)")
            return
        if not isinstance(groups, (list, tuple)):
            raise ConfigError("platform.ipc_groups", groups, "use a list of lists of ranks such as [[0, 1], [2, 3]], "
                              "[] for the single default group, or null for none (the task makes its own)")
        if not groups:
            return
        seen: dict[int, int] = {}
        for index, members in enumerate(groups):
            if not isinstance(members, (list, tuple)) or not members:
                raise ConfigError(f"platform.ipc_groups[{index}]", members, "each group is a non-empty list of ranks")
            for member in members:
                wrong = (f"rank {member!r} is not an integer; ranks are integers such as [0, 1]" if not is_int(member)
                         else f"rank {member!r} is outside {self._world_text()}" if not 0 <= member < self.world_size
                         else f"rank {member} is listed twice in this group; list each rank once"
                         if seen.get(member) == index else None)
                if wrong is not None:
                    raise ConfigError(f"platform.ipc_groups[{index}]", list(members), wrong)
                if member in seen:
                    raise ConfigError("platform.ipc_groups", [list(g) for g in groups], f"rank {member} is in "
                                      f"group {seen[member]} and group {index}; groups must not overlap")
                seen[member] = index
        if missing := sorted(set(range(self.world_size)) - set(seen)):
            raise ConfigError("platform.ipc_groups", [list(g) for g in groups], f"rank(s) {missing} are in no "
                              "group; every rank of the world must be in exactly one group (or use [] for the "
                              "single default group)")

    def _world_text(self) -> str:
        return f"the world of {self.world_size} rank(s) (0..{self.world_size - 1})"

    def _validate_slurm_parameters(self) -> None:
        params = self.slurm_additional_parameters
        if not isinstance(params, dict):
            raise ConfigError("platform.slurm_additional_parameters", params,
                              "use a mapping such as {reservation: maint}")
        for key, value in params.items():
            check_match("platform.slurm_additional_parameters", key, _SLURM_KEY,
                        "keys are sbatch option names without dashes, such as 'reservation' or 'gres'")
            if not isinstance(value, (str, int, float, bool)) or any(c in str(value) for c in "\n\r\0"):
                raise ConfigError(f"platform.slurm_additional_parameters.{key}", value, "values are single-line "
                                  "strings or numbers; a line break would add lines to the sbatch script")


def platform_from_config(node: Any, not_ours: str = "") -> Platform:
    """A `Platform` from a config node (a `platform` node, a mapping, or None for the defaults); unknown keys, at any
    level, raise `ConfigError`, with `not_ours` added when the node is not a mapping or has a key `Platform` lacks
    (it may be an app's own node of that name)."""
    from omegaconf import DictConfig

    if node is None:
        return Platform()
    if isinstance(node, Platform):
        return node
    if isinstance(node, DictConfig):  # a whole config's keys are the platform's fields, named `platform.<field>`
        root = node._get_parent() is None  # noqa: SLF001 - OmegaConf has no public way to ask for a node's root
        node = resolved_config(node, "platform." if root else "")
    if not isinstance(node, dict):
        raise ConfigError("platform", node, "platform must be a mapping of Platform fields" + not_ours)
    if isinstance(node.get("platform"), dict):  # (a preset written as a whole config: `platform:` at its top)
        raise ConfigError("platform.platform", node["platform"], "Platform has no field platform: a preset in "
                          "conf/platform/ is placed under platform already (its config group), so its fields go at "
                          "the file's top level; drop its `platform:` line and un-indent what it holds")
    check_known("platform.", node, {f.name for f in fields(Platform)}, "Platform", not_ours=not_ours, renamed=_RENAMED)
    return Platform(**node)


def resolved_config(node: Any, prefix: str = "") -> Any:
    """`node` as plain data, resolved; `ConfigError` naming a key whose value is missing or cannot be resolved by its
    full key in the node's config, after `prefix` (such as `platform.`, for a node that is a whole config)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        full_key = str(getattr(error, "full_key", "") or "")
        key = f"{prefix}{full_key}" if full_key else prefix.rstrip(".") or "platform"
        if isinstance(error, MissingMandatoryValue):
            raise ConfigError(key, "???", f"the value is missing: give one, such as {key}=... on the command line "
                              "or in the config") from None
        cause = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise ConfigError(key, _as_written(OmegaConf.to_container(node, resolve=False), key), f"cannot be resolved "
                          f"({cause}): set what it refers to, or give the value itself") from None


def _as_written(data: Any, key: str) -> Any:
    """The value at full key `key` (`a.b[0].c`, the node's own key somewhere at its start) in `data`, or None."""
    parts = [part for part in _KEY_PARTS.split(key) if part]
    suffixes = (".".join(parts[start:]) for start in range(len(parts)))
    return next((found for suffix in suffixes if (found := value_at(data, suffix)) is not None), None)


def value_at(data: Any, key: str) -> Any:
    """The value at `key` (`a.b[0].c`) in plain `data` (dicts and lists), or None."""
    for part in filter(None, _KEY_PARTS.split(key)):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def keys_where(data: Any, test: Callable[[Any], bool], prefix: str = "") -> list[str]:
    """The full keys (`a.b[0].c`, after `prefix`) of the values in plain `data` (dicts and lists) that pass `test`."""
    if isinstance(data, dict):
        return [key for name, value in data.items()
                for key in keys_where(value, test, f"{prefix}.{name}" if prefix else str(name))]
    if isinstance(data, list):
        return [key for index, value in enumerate(data) for key in keys_where(value, test, f"{prefix}[{index}]")]
    return [prefix] if test(data) else []
