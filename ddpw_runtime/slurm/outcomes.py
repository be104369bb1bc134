"""What the nodes of a SLURM job send back (`NodeOutcome`), and how the submitting side makes them one JobReturn:
rank 0's value, the root cause of a failure on any node (`launch/outcome.py`'s rule), or how SLURM ended the job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from ddpw_runtime.errors import RankFailure, SlurmJobError
from ddpw_runtime.launch.outcome import failure, root_cause
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import portable

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
    values: list[Any] = field(default_factory=list)
    """The return values of this node's ranks, in rank order (empty when the node failed)."""
    ranks: list[RankOutcome] = field(default_factory=list)
    """How this node's ranks ended, when one of them failed."""
    error: BaseException | None = None
    """Why this node failed other than by a rank's failure (its time limit, its controller)."""
    job_return: JobReturn | None = None
    """Node 0 only: what Hydra's `run_job` returned there (output dir, `.hydra/` and callbacks happen there)."""

    @staticmethod
    def failed(node: int, attempt: int, error: BaseException) -> NodeOutcome:
        """The outcome of a node whose ranks (or controller) failed with `error`."""
        if isinstance(error, RankFailure):
            return NodeOutcome(node, attempt, ranks=error.outcomes)
        return NodeOutcome(node, attempt, error=portable(error, SlurmJobError))


def state_error(job_id: str, state: str, logs: str, restarts: int) -> SlurmJobError:
    """The error for a job that SLURM ended as `state` (a sacct state) before all its nodes returned."""
    name = state.split()[0] if state else "UNKNOWN"
    text = _STATE_TEXT.get(name, f"ended as {name}")
    again = f" after {restarts} restart(s)" if restarts else ""
    return SlurmJobError(f"SLURM job {job_id} {text}{again} (sacct state: {state}); node logs: {logs}")


def job_failure(n_nodes: int, state: str, outcomes: dict[int, NodeOutcome], node_errors: dict[int, str],
                ended: SlurmJobError) -> BaseException | None:
    """Why a SLURM job failed, or None, in this order: a rank's own failure on any node; a node's own error (its
    time limit); a node controller that raised (`node_errors`: their text); how SLURM ended the job (`ended`:
    cancelled, timed out, out of memory: what the ranks saw follows from it); a rank that only lost its peers;
    nodes that sent nothing."""
    ranks: Sequence[RankOutcome] = [rank for node in outcomes.values() for rank in node.ranks]
    cause = root_cause(ranks)
    errors = [node.error for _, node in sorted(outcomes.items()) if node.error is not None]
    if cause is not None and not cause.is_secondary:
        return failure(ranks)
    if errors:
        return errors[0]
    if node_errors:
        node = min(node_errors)
        return SlurmJobError(f"the controller of node {node} failed:\n{node_errors[node]}")
    if state and state.split()[0] not in ("COMPLETED", "FAILED"):
        return ended
    if cause is not None:
        return failure(ranks)
    if len(outcomes) < n_nodes:
        missing = sorted(set(range(n_nodes)) - set(outcomes))
        return SlurmJobError(f"node(s) {missing} sent no result. {ended}")
    return None


def job_return(ret: JobReturn, n_nodes: int, state: str, outcomes: dict[int, NodeOutcome], node_errors: dict[int, str],
               ended: SlurmJobError) -> tuple[JobReturn, list[Any]]:
    """The JobReturn of one SLURM job and every rank's value; `ret`: node 0's JobReturn, else a FAILED shell."""
    made = job_failure(n_nodes, state, outcomes, node_errors, ended)
    if made is not None or ret.status is not JobStatus.COMPLETED:
        ret.status = JobStatus.FAILED
        ret.return_value = made if made is not None else ended
    return ret, [v for node in sorted(outcomes) for v in outcomes[node].values]
