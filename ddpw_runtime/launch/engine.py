"""The local engine: plan, start the ranks of one node, supervise them, hand back results (for the Hydra
launchers, a SLURM node, a plain run's supervisor and `Wrapper`). Never imports torch at import time.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from ddpw_conf import Platform
from ddpw_runtime.errors import RankFailure
from ddpw_runtime.launch import rendezvous
from ddpw_runtime.launch.checks import check, resolve_callable
from ddpw_runtime.launch.checks import gpus_available as gpus_available  # imported from here by others
from ddpw_runtime.launch.console import ConsoleRanks
from ddpw_runtime.launch.devices import Share
from ddpw_runtime.launch.outcome import RankOutcome, failure, note_failures
from ddpw_runtime.launch.payload import RankPayload, TaskCall, write_private
from ddpw_runtime.launch.plan import LaunchPlan, plan_local
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.starter import RankStarter, get_starter
from ddpw_runtime.launch.supervisor import Grace, NodeRanks, supervise

log = logging.getLogger("ddpw")

_T = TypeVar("_T")


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
    """The job's id as the ranks see it (`TORCHELASTIC_RUN_ID`, `run_id()`): the same on every node and
    across restarts when given, else a new random id."""
    max_restarts: int = 0
    """How many times the job may be started again: after a failure (`restart_on_failure`), or, on SLURM,
    after a preemption or its time limit."""
    restart_count: int = 0
    """How many times the job has been started again before this run."""
    restart_on_failure: bool = True
    """A failed run is started again while restarts are left (locally; a SLURM job is requeued instead)."""
    console_prefix: str = ""
    """Put before every console line of this job's ranks (a job's number when jobs run side by side)."""
    share: Share | None = None
    """The GPUs and CPU cores of its own, when jobs run side by side."""


def starter_for(platform: Platform) -> RankStarter:
    """The rank starter for `platform`'s start method, started now if need be (the launchers ask early, so
    it imports torch while this process goes on)."""
    return get_starter(preload=platform.spawn_method == "forkserver")


class LocalJob:
    """The ranks of one node of one job, ready to start: the rank starter (none with `starts_ranks=False`: a
    world of one in the caller), the rendezvous socket (bound before any rank starts, on the node that hosts the
    store), the plan, the payload (`task`, a packed `TaskCall`, and `state`, the launching process's) and a
    private folder for the results, until `close`."""

    def __init__(self, task: bytes, state: ProcessState, job: NodeJob, starts_ranks: bool = True) -> None:
        platform = job.platform
        self.job = job
        self._starter = starter_for(platform) if starts_ranks else None
        hosts_store = job.node_rank == 0 and platform.ipc_protocol == "tcp"
        self.listener = rendezvous.listen(platform, job.master_addr, job.master_port) if hosts_store else None
        self.listen_fd = self.listener.fileno() if self.listener is not None else None
        """The bound rendezvous socket's descriptor, on the node that hosts the store."""
        self.workdir = Path(tempfile.mkdtemp(prefix="ddpw-"))
        try:
            port = self.listener.getsockname()[1] if self.listener is not None else job.master_port
            self.plan: LaunchPlan = plan_local(
                platform, Path(job.log_dir).resolve(), self.workdir, job.run_id or uuid.uuid4().hex[:12],
                job.node_rank, job.master_addr, port, job.max_restarts, job.restart_count, job.share,
            )
            self.payload = RankPayload(self.plan, task, state, str(self.workdir))
            self.payload_path = self.workdir / "payload.pkl"
            write_private(self.payload_path, self.payload)
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
        """The job's TCPStore, served by this process on a duplicate of the rendezvous socket, as
        torchrun's agent serves it (this imports torch): rank 0 then joins it like every rank, and when the
        job is stopped, dropping it makes a rank still joining fail at once instead of after the collective
        timeout (a rank blocked there cannot be told otherwise)."""
        from datetime import timedelta

        from torch.distributed import TCPStore

        assert self.listen_fd is not None  # node 0 with the tcp rendezvous (check_caller_rank)
        own_fd = os.dup(self.listen_fd)
        try:
            return TCPStore(self.plan.master_addr, self.plan.master_port, self.plan.world_size, is_master=True,
                            wait_for_workers=False, master_listen_fd=own_fd,
                            timeout=timedelta(minutes=self.plan.platform.collective_timeout_min))
        except BaseException:
            os.close(own_fd)
            raise

    def console(self, skip: int | None = None) -> ConsoleRanks:
        """The console of this node's console ranks (`platform.console_ranks`), but `skip` (a rank that runs
        in this process)."""
        shown = [rank for rank in self.plan.console_ranks if rank in self.plan.global_ranks]
        files = {rank: self.plan.log_file(rank) for rank in shown if rank != skip}
        return ConsoleRanks(files, self.job.console_prefix, ranked=len(shown) > 1)

    def close(self) -> None:
        """Close the rendezvous socket and remove the private folder."""
        if self.listener is not None:
            self.listener.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def settle(job: NodeJob, outcomes: list[RankOutcome]) -> None:
    """After a node's ranks ended: write each failed rank's traceback into its log, raise the
    `RankFailure` of the root cause if any rank failed, else call `platform.upon_finish`."""
    note_failures(outcomes)
    made = failure(outcomes)
    if made is not None:
        raise made
    if job.platform.upon_finish:
        resolve_callable("platform.upon_finish", job.platform.upon_finish)()


def run_ranks(task: TaskCall, job: NodeJob, caller_rank: bool = False) -> list[Any]:
    """Run `task` on every rank of this node; their return values in rank order. Raises RankFailure (root cause
    first) when a rank fails and no restart is left (`with_restarts`); no rank outlives the call. With `caller_rank`
    (checked by `check_caller_rank`), rank 0 runs in this process (`caller_rank.py`), its value the object itself."""
    packed, state = task.pack(), ProcessState.capture()
    return with_restarts(job, lambda attempt: _run_once(task, packed, state, attempt, caller_rank))


def with_restarts(job: NodeJob, run: Callable[[NodeJob], _T]) -> _T:
    """`run(job)`, and while it fails and restarts are left (`restart_on_failure`, `max_restarts`), says so
    and runs the job again, in the same log dir with the same run id and the next restart count; a time
    limit or an interruption is not restarted."""
    job = replace(job, run_id=job.run_id or uuid.uuid4().hex[:12])
    while True:
        try:
            return run(job)
        except RankFailure as failure:
            if not job.restart_on_failure or job.restart_count >= job.max_restarts:
                raise
            log.warning(
                "%sattempt %d of %d failed: rank %d (node %d) failed: %s; starting the job again (restart %d of "
                "%d), in the same output dir", job.console_prefix, job.restart_count + 1, job.max_restarts + 1,
                failure.rank, failure.node, failure.cause, job.restart_count + 1, job.max_restarts,
            )
            job = replace(job, restart_count=job.restart_count + 1)


def _run_once(task: TaskCall, packed: bytes, state: ProcessState, job: NodeJob, caller_rank: bool) -> list[Any]:
    from ddpw_runtime.launch.caller_rank import CallerRank

    with closing(LocalJob(packed, state, job, starts_ranks=not caller_rank or job.platform.world_size > 1)) as local:
        if not caller_rank:
            with local.console() as console:
                outcomes = supervise(NodeRanks(local, local.plan.global_ranks, console))
            settle(job, outcomes)
            return [o.result.value() for o in outcomes if o.result is not None]
        with CallerRank(local) as rank_zero:
            own = rank_zero.call(task)
            outcomes = rank_zero.finish()
        try:
            settle(job, outcomes)
        except RankFailure as failure:
            if failure.rank == 0 and rank_zero.own_error is not None:
                failure.__cause__ = rank_zero.own_error  # the object itself, not a copy
            raise
        return [own, *(o.result.value() for o in outcomes[1:] if o.result is not None)]


def describe(platform: Platform, log_dir: Path) -> str:
    """The platform and launch plan as a dry run prints them (nothing is started)."""
    check(platform)
    return plan_local(platform, Path(log_dir).resolve(), Path("<private dir>"), "<run id>", master_port=0).describe()
