"""`LaunchPlan`: a validated Platform turned into concrete ranks, addresses, files and groups."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpw_conf import Device, Platform
from ddpw_runtime.launch.devices import Share

LOOPBACK = "127.0.0.1"

DUMP_SIGNAL = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1
"""What asks a rank for every thread's Python stack (faulthandler writes them to its `stacks_file`): a real-time signal
no library uses, where there are such, so a task's own SIGUSR1 handler (a checkpoint on signal) never runs for it."""
RECORDER_PREFIX = "fr_rank_"
"""A rank's flight-recorder dump in the job's output dir, less its rank (torch's `TORCH_FR_DUMP_TEMP_FILE`)."""
THREADS_ENV = "OMP_NUM_THREADS"
"""The threads each rank's torch uses: the user's value where set, else the plan's split."""


def threads_set_in(environ: Mapping[str, str]) -> int | None:
    """The threads a rank's torch uses by its environment `environ`: `OMP_NUM_THREADS` when it is a count (kept, as
    torchrun keeps it), else None (the plan's `threads_per_rank`)."""
    value = environ.get(THREADS_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def stacks_file(log_dir: Path, rank: int | str) -> Path:
    """Rank `rank`'s stacks file in the output dir `log_dir` (`rank` "<k>": as reports name them all)."""
    return log_dir / f"stacks_rank_{rank}.txt"


def recorder_file(log_dir: Path, rank: int | str) -> Path:
    """Rank `rank`'s flight-recorder dump in the output dir `log_dir` (`rank` "<k>": as reports name them all)."""
    return log_dir / f"{RECORDER_PREFIX}{rank}"


@dataclass
class LaunchPlan:
    """Everything needed to start the ranks of one node of one job."""

    platform: Platform
    node_rank: int
    world_size: int
    ranks_per_node: int
    backend: str
    device: str  # torch device type of each rank: 'cpu', 'cuda' or 'mps'
    master_addr: str
    master_port: int
    init_method: str
    log_dir: Path
    threads_per_rank: int
    console_ranks: list[int] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)
    makes_group: bool = True
    """Whether ranks get the job's process group before the task (False: `ipc_groups=None`, the task makes its own)."""
    run_id: str = ""
    max_restarts: int = 0  # how many times the job may be started again (torchrun's `--max-restarts`)
    restart_count: int = 0  # how many times it was started again before this run (0: its first run)
    share: Share | None = None  # its own GPUs and CPU cores, when jobs run side by side (None: the machine's)

    @property
    def global_ranks(self) -> list[int]:
        """The global ranks that run on this node."""
        first = self.node_rank * self.ranks_per_node
        return list(range(first, first + self.ranks_per_node))

    def log_file(self, rank: int) -> Path:
        """Where the stdout and stderr of global rank `rank` go."""
        return self.log_dir / f"rank_{rank}.log"

    def one_line(self) -> str:
        """The plan in one line, as logged when a job starts."""
        return (f"{self.world_size} rank(s) ({self.platform.n_nodes} node(s) x {self.ranks_per_node}) on "
                f"{self.device}, {self.backend} via {self.init_method}, logs in {self.log_dir}/rank_<rank>.log")

    def describe(self, env_set: Mapping[str, Any] | None = None) -> str:
        """A readable multi-line summary with the platform's, as the dry run prints it (`env_set`: the job's
        `hydra.job.env_set`, which the ranks' environment gets on top of this process's)."""
        set_threads = threads_set_in({**os.environ, **{k: str(v) for k, v in (env_set or {}).items()}})
        threads = f"{set_threads} ({THREADS_ENV})" if set_threads else self.threads_per_rank
        groups = str(self.groups or "world only") if self.makes_group else \
            "none: the task makes its own process group (ipc_groups=null)"
        rendezvous = self.init_method
        if rendezvous.startswith("tcp://") and not self.master_port:  # (a dry run's: no port chosen yet)
            chosen = "node 0 chooses as each job starts" if self.platform.n_nodes > 1 else "chosen when the job starts"
            rendezvous = f"{rendezvous.rsplit(':', 1)[0]} (a free port, {chosen})"
        console = str(self.console_ranks or "none")
        logs = f"{self.log_file(0).parent}/rank_<rank>.log"
        node = []
        if self.node_rank:  # another node of a job across machines runs node 0's config, in node 0's output dir
            first, last = self.global_ranks[0], self.global_ranks[-1]
            node = [f"node            : {self.node_rank} of {self.platform.n_nodes}, rank(s) "
                    f"{first if first == last else f'{first}-{last}'}; it takes node 0's config, output dir and task "
                    "as it joins (node 0's values count where its command differs from this one)"]
            here = [rank for rank in self.console_ranks if rank in self.global_ranks]
            console = f"{here or 'none'} (this node's among platform.console_ranks, node 0's value)"
            logs = "node 0's output dir (its dry run shows it)/rank_<rank>.log, as this machine sees that path"
        return "\n".join([
            *node,
            f"world size      : {self.world_size} ({self.platform.n_nodes} node(s) x {self.ranks_per_node} rank(s))",
            f"device          : {self.device}",
            f"backend         : {self.backend}",
            f"rendezvous      : {rendezvous}",
            f"start method    : {self.platform.spawn_method}",
            f"threads per rank: {threads}",
            f"groups          : {groups}",
            f"console ranks   : {console}",
            f"rank logs       : {logs}",
            "--- platform ---",
            self.platform.summary(),
        ])


def free_port(host: str) -> int:
    """A port free on `host` (all addresses: "") right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def plan_local(platform: Platform, log_dir: Path, rendezvous_dir: Path, run_id: str, node_rank: int = 0,
               master_addr: str | None = None, master_port: int | None = None, max_restarts: int = 0,
               restart_count: int = 0, share: Share | None = None) -> LaunchPlan:
    """The plan for node `node_rank` of a validated `platform`: address and port from `platform`, else the arguments,
    else loopback and a free port (`master_port` 0: none chosen yet, as a dry run shows it); a `file` rendezvous in
    `rendezvous_dir`; with `share`, only its GPUs and cores."""
    addr = platform.master_addr or master_addr or LOOPBACK
    port = platform.master_port or (free_port(addr if platform.n_nodes == 1 else "") if master_port is None
                                    else master_port)
    init_method = f"file://{rendezvous_dir / 'rendezvous'}" if platform.ipc_protocol == "file" else f"tcp://{addr}:{port}"
    cpus = (share.n_cpus if share is not None else None) or platform.n_cpus_per_node or os.cpu_count() or 1
    return LaunchPlan(
        platform=platform, node_rank=node_rank, world_size=platform.world_size, ranks_per_node=platform.ranks_per_node,
        backend=platform.resolved_backend,
        device="cuda" if platform.uses_gpus else "mps" if platform.device_kind is Device.MPS else "cpu",
        master_addr=addr, master_port=port, init_method=init_method, log_dir=log_dir,
        threads_per_rank=max(1, cpus // platform.ranks_per_node), console_ranks=platform.shown_ranks(),
        groups=[list(g) for g in platform.ipc_groups or []], makes_group=platform.ipc_groups is not None,
        run_id=run_id, max_restarts=max_restarts, restart_count=restart_count, share=share,
    )
