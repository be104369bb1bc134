"""The local engine: plan, start and supervise one node's ranks, hand back results (for the Hydra launchers, a SLURM
node, a plain run's supervisor and `Wrapper`). Never imports torch at import time."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from ddpw_conf import Platform
from ddpw_runtime.errors import RankFailure
from ddpw_runtime.launch.checks import check, resolve_callable
from ddpw_runtime.launch.checks import gpus_available as gpus_available  # imported from here by others
from ddpw_runtime.launch.job import NodeJob, local_job
from ddpw_runtime.launch.outcome import failure, note_failures
from ddpw_runtime.launch.payload import TaskCall
from ddpw_runtime.launch.plan import plan_local
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.protocol import JobStarting
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.supervisor import NodeRanks, supervise
from ddpw_runtime.nodes.controller import lead

log = logging.getLogger("ddpw")

_T = TypeVar("_T")


def settle(job: NodeJob, outcomes: list[RankOutcome]) -> None:
    """After a node's ranks ended: log failures, raise the root cause's `RankFailure`, else call `upon_finish`."""
    note_failures(outcomes)
    if (made := failure(outcomes)) is not None:
        raise made
    if job.platform.upon_finish:
        resolve_callable("platform.upon_finish", job.platform.upon_finish)()


def run_ranks(task: TaskCall, job: NodeJob, on_attempt: Callable[[NodeJob], None] = lambda job: None) -> list[Any]:
    """Run `task` on this node's ranks (none outlives the call); their values in rank order, else `RankFailure`
    (`on_attempt`: see `with_restarts`)."""
    packed, state = task.pack(), ProcessState.capture()
    return with_restarts(job, lambda attempt: _run_once(packed, state, attempt), on_attempt=on_attempt)


def with_restarts(job: NodeJob, run: Callable[[NodeJob], _T], can_run_again: Callable[[], bool] = lambda: True,
                  on_attempt: Callable[[NodeJob], None] = lambda job: None) -> _T:
    """`run(job)`, again (said so, same log dir and run id, next restart count) while it fails with a `RankFailure` and
    restarts are left (`restart_on_failure`, `max_restarts`) and `can_run_again()`; not after a time limit or an
    interruption. `on_attempt(job)` before each run: how many restarts the job took, for its end line and summary."""
    job = replace(job, run_id=job.run_id or uuid.uuid4().hex[:12])
    while True:
        on_attempt(job)
        try:
            return run(job)
        except RankFailure as failure:
            if not job.restart_on_failure or job.restart_count >= job.max_restarts or not can_run_again():
                raise
            log.warning("%sattempt %d of %d failed: rank %d (node %d) failed: %s; starting the job again (restart %d "
                        "of %d), in the same output dir", job.console_prefix, job.restart_count + 1,
                        job.max_restarts + 1, failure.rank, failure.node, failure.cause, job.restart_count + 1,
                        job.max_restarts)
            job = replace(job, restart_count=job.restart_count + 1)


def _run_once(packed: bytes, state: ProcessState, job: NodeJob) -> list[Any]:
    with local_job(packed, state, job) as local, local.console() as console:
        if job.leads_nodes:  # the other nodes follow (`procs/node.py`)
            outcomes = lead(local, console, JobStarting(packed, state, str(job.log_dir)))
        else:
            # Served here, not by rank 0: a rank 0 whose task returned then ends at once, so a peer still waiting
            # for it in a collective fails on the closed connection (`EndedEarly`), not at the collective timeout.
            if local.listen_fd is not None:
                local.host_store()
            outcomes = supervise(NodeRanks(local, local.plan.global_ranks, console, local.drop_store))
    settle(job, outcomes)
    return [o.result.value() for o in outcomes if o.result is not None]


def describe(platform: Platform, log_dir: Path, env_set: Mapping[str, Any] | None = None) -> str:
    """The platform and launch plan as a dry run prints them (nothing is started; `env_set`: the job's
    `hydra.job.env_set`); for node `platform.node_rank` of a job across machines."""
    check(platform)
    plan = plan_local(platform, Path(log_dir).resolve(), Path("<private dir>"), "<run id>",
                      node_rank=platform.node_rank or 0, master_port=0)
    return plan.describe(env_set)
