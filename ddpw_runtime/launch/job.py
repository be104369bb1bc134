"""One node's part of one distributed job: what it is (`NodeJob`, with the `Grace` its ranks get after a signal) and
what starting it needs (`LocalJob`: the rank starter, the rendezvous socket, the plan, the payload, a private folder).
It starts no rank. No torch at import time."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpw_conf import Platform
from ddpw_runtime.launch import rendezvous
from ddpw_runtime.launch.console import ConsoleRanks
from ddpw_runtime.launch.devices import Share
from ddpw_runtime.launch.hangs import drop_stacks
from ddpw_runtime.launch.payload import RankPayload, write_private
from ddpw_runtime.launch.plan import LaunchPlan, plan_local
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.rank_outcome import run_start
from ddpw_runtime.launch.signals import held
from ddpw_runtime.launch.starter import RankStarter, get_starter, import_torch_first

log = logging.getLogger("ddpw")


@dataclass
class Grace:
    """How long ranks get to end after a signal."""

    stop_s: float = 1.0
    """After SIGTERM, when another rank failed or the time limit passed."""
    interrupt_s: float = 10.0
    """After Ctrl-C or SIGTERM to the controller (passed on to them)."""


@dataclass(frozen=True)
class NodeJob:
    """One node's part of a distributed job, as the engine runs it."""

    platform: Platform
    log_dir: Path
    grace: Grace = field(default_factory=Grace)
    node_rank: int = 0
    master_addr: str | None = None
    """Where the ranks meet when the platform does not say (the first node of a SLURM allocation)."""
    master_port: int | None = None
    run_id: str | None = None
    """The job's id as ranks see it (`TORCHELASTIC_RUN_ID`), the same on every node and restart; None: a random one."""
    max_restarts: int = 0
    """How often the job may start again: after a failure (`restart_on_failure`), a SLURM preemption or time limit."""
    restart_count: int = 0
    """How often the job started again before this run."""
    restart_on_failure: bool = True
    """A failed run is started again while restarts are left (locally; a SLURM job is requeued instead)."""
    leads_nodes: bool = False
    """This node (0) leads the job's others (a multirun's job across machines, no SLURM: its store and the job's)."""
    console_prefix: str = ""
    """Put before each console line of its ranks (a job's number when jobs run side by side)."""
    share: Share | None = None
    """Its own GPUs and CPU cores, when jobs run side by side."""
    second_signal_kills: bool = True
    """A second Ctrl-C or SIGTERM in the ranks' interrupt grace kills them at once. Not in a multirun's job process,
    where the sweep's passed-on signal and `pkill -f train.py` are one interruption (the sweep kills on a second)."""
    scratch: str | None = None
    """Where its private folders are made (None: the system's temporary folder; a multirun's job process: its own
    folder, which the rank starter removes even when the job process is killed before it could say which)."""


def starter_for(platform: Platform) -> RankStarter:
    """The rank starter for `platform`'s start method, started now if need be (early: it imports torch meanwhile)."""
    return get_starter(preload=platform.spawn_method == "forkserver")


class LocalJob:
    """One node's ranks of one job, ready to start until `close`: the rank starter (none with `starts_ranks=False`),
    the rendezvous socket (on the store's node), the plan, the payload (`task` and `state`) and a private folder."""

    def __init__(self, task: bytes, state: ProcessState, job: NodeJob, starts_ranks: bool = True) -> None:
        platform = job.platform
        self.job = job
        hosts_store = job.node_rank == 0 and platform.ipc_protocol == "tcp"
        if hosts_store:  # it serves the store (`host_store`), with torch
            import_torch_first()
        self._starter = starter_for(platform) if starts_ranks else None
        self.listener = rendezvous.listen(platform, job.master_addr, job.master_port) if hosts_store else None
        self.listen_fd = self.listener.fileno() if self.listener is not None else None
        """The bound rendezvous socket's descriptor, on the store's node."""
        self.store: Any = None
        """The job's TCPStore while this process serves it (`host_store`, `drop_store`)."""
        self.workdir = Path(tempfile.mkdtemp(prefix="ddpw-", dir=job.scratch))
        try:
            port = self.listener.getsockname()[1] if self.listener is not None else job.master_port
            self.plan: LaunchPlan = plan_local(platform, Path(job.log_dir).resolve(), self.workdir,
                                               job.run_id or uuid.uuid4().hex[:12], job.node_rank, job.master_addr,
                                               port, job.max_restarts, job.restart_count, job.share)
            self.payload = RankPayload(self.plan, task, state, str(self.workdir))
            self.payload_path = self.workdir / "payload.pkl"
            write_private(self.payload_path, self.payload)
            _start_files(self.plan)
        except BaseException:
            self.close()
            raise
        if platform.verbose:
            log.info(self.plan.one_line())

    @property
    def starter(self) -> RankStarter:
        """The rank starter (started here, before this process starts threads: only then is it a fork)."""
        assert self._starter is not None, "this job starts no rank"
        return self._starter

    def host_store(self) -> Any:
        """The job's TCPStore, served here (the process that supervises node 0's ranks) until `drop_store` or `close`,
        on a duplicate of the rendezvous socket, as torchrun's agent does (imports torch); every rank joins it. It
        outlives every rank, which then ends with its task."""
        from datetime import timedelta

        from torch.distributed import TCPStore

        assert self.listen_fd is not None  # node 0 with the tcp rendezvous (check_caller_rank)
        # Whole: a Ctrl-C right after the store took the descriptor would have it closed here too, and the store's
        # own close would then close whatever reused it.
        with held():
            own_fd = os.dup(self.listen_fd)
            try:
                self.store = TCPStore(self.plan.master_addr, self.plan.master_port, self.plan.world_size,
                                      is_master=True, wait_for_workers=False, master_listen_fd=own_fd,
                                      timeout=timedelta(minutes=self.plan.platform.collective_timeout_min))
            except BaseException:
                os.close(own_fd)
                raise
        return self.store

    def drop_store(self) -> None:
        """Stop serving the job's store (the job is being stopped): a rank still joining it fails at once."""
        self.store = None

    def console(self, skip: int | None = None) -> ConsoleRanks:
        """The console of this node's `platform.console_ranks` but `skip` (a rank that runs in this process)."""
        shown = [rank for rank in self.plan.console_ranks if rank in self.plan.global_ranks]
        files = {rank: self.plan.log_file(rank) for rank in shown if rank != skip}
        return ConsoleRanks(files, self.job.console_prefix, ranked=len(shown) > 1)

    def close(self) -> None:
        """Stop serving the store, close the rendezvous socket and remove the private folder."""
        self.drop_store()
        if self.listener is not None:
            self.listener.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _start_files(plan: LaunchPlan) -> None:
    """Ready this node's ranks' files in the output dir for this run of the job: remove the stacks files and
    flight-recorder dumps an earlier attempt or job left there (they would pass for this run's), and mark where this
    run starts in a rank log that already holds output (a restart, a `Wrapper`'s fixed `log_dir`, a run again)."""
    drop_stacks(plan, empty_only=False)
    line = run_start(time.strftime("%Y-%m-%d %H:%M:%S"), plan.restart_count, plan.max_restarts)
    for rank in plan.global_ranks:
        with contextlib.suppress(OSError):
            if plan.log_file(rank).stat().st_size:
                with open(plan.log_file(rank), "a", encoding="utf-8") as log_file:
                    log_file.write(line)


@contextmanager
def local_job(task: bytes, state: ProcessState, job: NodeJob, starts_ranks: bool = True) -> Iterator[LocalJob]:
    """A `LocalJob` for the block, made and closed whole, so an interruption at any moment leaves no private folder."""
    local = None
    try:
        with held():
            local = LocalJob(task, state, job, starts_ranks)
        yield local
    finally:
        if local is not None:
            with held():
                local.close()

