"""What the nodes of a SLURM job send back, and how the submitting side turns it into one JobReturn:
rank 0's value, or the root cause of a failure on any node, or how SLURM ended the job."""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus

from ddpw_runtime.results import RankFailure, RankResult

INCOMPLETE_STATES = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "PREEMPTED",
                     "RESIZING", "SUSPENDED", "UNKNOWN", "READY")
"""sacct states of a job that has not ended (PREEMPTED: it is requeued next)."""

_STATE_TEXT = {
    "CANCELLED": "was cancelled",
    "TIMEOUT": "reached its time limit (platform.timeout_min) and was stopped",
    "OUT_OF_MEMORY": "ran out of memory (raise platform.mem_per_node)",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "BOOT_FAIL": "could not start its nodes (BOOT_FAIL)",
    "DEADLINE": "passed its deadline",
    "FAILED": "failed",
}


@dataclass
class NodeOutcome:
    """What the controller of one node returns (its submitit task result)."""

    node: int
    attempt: int
    """SLURM's restart count of the run that produced this outcome (0: the first run)."""
    values: List[Any] = field(default_factory=list)
    """The return values of this node's ranks, in rank order (empty when the node failed)."""
    failure: Optional[BaseException] = None
    """Why this node's ranks did not all return: a `RankFailure` (root cause on this node), `JobTimedOut`, ..."""
    failed_at: float = 0.0
    job_return: Optional[JobReturn] = None
    """Node 0 only: what Hydra's `run_job` returned there (output dir, `.hydra/` and callbacks happen there)."""


class SlurmJobError(RuntimeError):
    """A SLURM job ended without every node's result: cancelled, timed out, out of memory, lost a node,
    or a node controller failed outside the ranks. The message says which, and where the logs are."""


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives the trip to the submitting side (pickled there, unpickled here), else a
    `SlurmJobError` with its type, message and traceback as text."""
    try:
        pickle.loads(cloudpickle.dumps(exc))
    except Exception:  # noqa: BLE001 - odd constructors, unpicklable attributes: keep the text
        text = "".join(traceback.format_exception(exc)).rstrip()
        return SlurmJobError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{text}")
    return exc


def is_secondary(failure: BaseException) -> bool:
    """Whether `failure` only says that another rank went away first (a lost connection, a store timeout)."""
    result = _failed_rank_result(failure)
    return result is not None and result.is_secondary


def root_cause(outcomes: Sequence[NodeOutcome]) -> Optional[BaseException]:
    """The failure to report among the nodes' outcomes: a rank that failed on its own before any that
    only lost its peers, the earliest first; None when no node reports a failure."""
    failed = [o for o in outcomes if o.failure is not None]
    if not failed:
        return None
    primary = [o for o in failed if not is_secondary(o.failure)]  # type: ignore[arg-type]

    def when(outcome: NodeOutcome) -> float:
        result = _failed_rank_result(outcome.failure)  # type: ignore[arg-type]
        return result.finished_at if result is not None else outcome.failed_at

    return min(primary or failed, key=when).failure


def _failed_rank_result(failure: BaseException) -> Optional[RankResult]:
    if not isinstance(failure, RankFailure):
        return None
    return next((r for r in failure.results if r is not None and r.rank == failure.rank and not r.ok), None)


def latest(outcomes: Dict[int, NodeOutcome]) -> Dict[int, NodeOutcome]:
    """The outcomes of the latest run only: a node of a requeued job may have left one from an earlier run."""
    if not outcomes:
        return {}
    attempt = max(o.attempt for o in outcomes.values())
    return {node: o for node, o in outcomes.items() if o.attempt == attempt}


def state_error(job_id: str, state: str, logs: str, restarts: int) -> SlurmJobError:
    """The error for a job that SLURM ended as `state` (a sacct state) before all its nodes returned."""
    name = state.split()[0] if state else "UNKNOWN"
    text = _STATE_TEXT.get(name, f"ended as {name}")
    again = f" after {restarts} restart(s)" if restarts else ""
    return SlurmJobError(f"SLURM job {job_id} {text}{again} (sacct state: {state}); node logs: {logs}")


def job_return(
    ret: JobReturn,
    n_nodes: int,
    state: str,
    outcomes: Dict[int, NodeOutcome],
    node_errors: Dict[int, str],
    ended: SlurmJobError,
) -> JobReturn:
    """The JobReturn of one SLURM job. `ret` is node 0's JobReturn when it sent one, else a FAILED shell;
    `node_errors` holds the text of node controllers that raised; `ended` is the error that says how
    SLURM ended the job, reported when no failure of a rank or a controller explains it better."""
    cause = root_cause(list(outcomes.values()))
    ret.rank_values = [v for node in sorted(outcomes) for v in outcomes[node].values]  # type: ignore[attr-defined]
    if len(outcomes) == n_nodes and cause is None and not node_errors and ret.status is JobStatus.COMPLETED:
        return ret
    name = state.split()[0] if state else ""
    if cause is not None and not is_secondary(cause):
        failure: BaseException = cause
    elif node_errors:
        node = min(node_errors)
        failure = SlurmJobError(f"the controller of node {node} failed:\n{node_errors[node]}")
    elif name not in ("", "COMPLETED", "FAILED"):
        failure = ended  # cancelled, timed out, out of memory, ...: what the ranks saw follows from it
    elif cause is not None:
        failure = cause
    else:
        missing = sorted(set(range(n_nodes)) - set(outcomes))
        failure = SlurmJobError(f"node(s) {missing} sent no result. {ended}")
    ret.status = JobStatus.FAILED
    ret.return_value = failure
    return ret
