"""What the nodes of a SLURM job send back (`NodeOutcome`), and how the submitting side makes them one JobReturn:
rank 0's value, the root cause of a failure on any node (`launch/outcome.py`'s rule), or how SLURM ended the job."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from ddpw_conf import Platform
from ddpw_conf.launcher import SlurmLauncherConf
from ddpw_runtime.errors import JobTimedOut, RankFailure, SlurmJobError
from ddpw_runtime.launch.outcome import failure, root_cause
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RankResult, portable
from ddpw_runtime.nodes.controller import with_every_node

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


_PER_JOB_LIMIT = re.compile(r"(Assoc|QOS)\w*PerJob\w*")
"""squeue reasons of a job above a per-job limit of its account (association) or QOS: such as
QOSMaxWallDurationPerJobLimit, AssocMaxNodesPerJobLimit."""


def partition(platform: Platform) -> str:
    """`partition <name>`, or `the default partition`."""
    return f"partition {platform.partition}" if platform.partition else "the default partition"


def _resources(platform: Platform) -> str:
    return (f"platform.n_procs_per_node / n_gpus_per_node, platform.n_cpus_per_node={_typed(platform.n_cpus_per_node)}"
            f", platform.mem_per_node={platform.mem_per_node}")


def _typed(value: Any) -> str:
    """`value` as a user types it in a config or an override (`null`, not Python's `None`)."""
    return "null" if value is None else str(value)


def _never_starts(platform: Platform, options: SlurmLauncherConf) -> dict[str, str]:
    """Why a job SLURM gives one of these (squeue's) reasons can never start as asked, and the key to change."""
    where, resources = partition(platform), _resources(platform)
    another = "or choose another platform.partition (sinfo lists them)"
    return {
        "PartitionNodeLimit": f"it asks for more nodes than {where} has or allows: lower platform.n_nodes="
                              f"{platform.n_nodes} {another}",
        "PartitionTimeLimit": f"its time limit is above the MaxTime of {where}: lower platform.timeout_min="
                              f"{platform.timeout_min:g} {another}",
        "PartitionConfig": f"{where} cannot hold it as asked ({platform.n_nodes} node(s) of {platform.ranks_per_node} "
                           f"rank(s), the CPUs and memory asked) or does not take its account or QOS: lower "
                           f"platform.n_nodes={platform.n_nodes}, {resources}, {another}",
        "BadConstraints": "no node has the features or resources it asks for: change hydra.launcher.constraint="
                          f"{_typed(options.constraint)} or platform.slurm_additional_parameters",
        "InvalidQOS": f"SLURM does not take its QOS: change hydra.launcher.qos={_typed(options.qos)}",
        "InvalidAccount": f"SLURM does not take its account: change hydra.launcher.account={_typed(options.account)}",
        "DependencyNeverSatisfied": "a job it depends on did not end as it needs: change the dependency in "
                                    "platform.slurm_additional_parameters",
    }


_SBATCH_REFUSALS = {
    "Invalid partition name specified": "partition",
    "Invalid node name specified": "node name",
    "Requested reservation is invalid": "reservation",
    "Invalid feature specification": "BadConstraints",
    "Invalid qos specification": "InvalidQOS",
    "Invalid account": "InvalidAccount",
    "Node count specification invalid": "PartitionNodeLimit",
    "Requested time limit is invalid": "PartitionTimeLimit",
    "Requested node configuration is not available": "PartitionConfig",
    "Requested partition configuration not available": "PartitionConfig",
    "Job violates accounting/QOS policy": "QOSMaxPerJobLimit",
}
"""sbatch's refusals (part of SLURM's error text) and the pending reason whose fix is theirs, or a fix of their own."""


def sbatch_refusal(text: str, platform: Platform, options: SlurmLauncherConf) -> str:
    """What to change where sbatch refused a job of `platform` with `text` (its error output); '' if not known."""
    found = next((name for start, name in _SBATCH_REFUSALS.items() if start in text), None)
    own = {
        "partition": f"SLURM has no partition {platform.partition!r}: change platform.partition to one sinfo lists, "
                     "or leave it unset (null) for the cluster's default",
        "node name": "SLURM has no node of a name it was given: change hydra.launcher.exclude="
                     f"{_typed(options.exclude)} (or a node list in platform.slurm_additional_parameters) to nodes "
                     "sinfo -N lists",
        "reservation": "SLURM has no such reservation, or it is not yours: change the reservation in "
                       "platform.slurm_additional_parameters (scontrol show reservation lists them)",
    }
    if found is None:
        return ""
    return own.get(found) or _never_text(found, platform, options)


def _never_text(name: str, platform: Platform, options: SlurmLauncherConf) -> str:
    """Why a job pending for `name`, a reason that never passes, cannot start, and the keys to change."""
    return _never_starts(platform, options).get(name) or (
        f"it is above a per-job limit of its account or QOS: lower {_resources(platform)}, platform.n_nodes="
        f"{platform.n_nodes} or platform.timeout_min={platform.timeout_min:g}, or change hydra.launcher.qos / "
        "hydra.launcher.account")


def pending_reason(job_ids: list[str], reason: str, platform: Platform, options: SlurmLauncherConf) -> tuple[str, bool]:
    """What the console says of the jobs `job_ids` (of equal parameters) pending for `reason` (squeue's): the line, and
    whether they can never start as they are (a limit or a name their partition, account or QOS refuses: only a change
    of the job resolves it)."""
    shown = ", ".join(job_ids) if len(job_ids) <= 3 else f"{job_ids[0]} ... {job_ids[-1]} ({len(job_ids)} jobs)"
    jobs = f"job {shown} is" if len(job_ids) == 1 else f"jobs {shown} are"
    where = partition(platform)
    nodes_out = ("nodes it needs are down, drained or reserved; it starts once they are back (hydra.launcher.exclude "
                 "leaves nodes out; a shorter platform.timeout_min may end before a reservation)")
    waits = {
        "Priority": "jobs of higher priority go first",
        "Resources": "it waits for free nodes",
        "ReqNodeNotAvail": nodes_out,
        "Nodes required for job are DOWN": nodes_out,  # (squeue's text of ReqNodeNotAvail without named nodes)
        "PartitionDown": f"{where} is down; it starts once it is up again",
        "BeginTime": "it waits for its begin time (SLURM starts a requeued job again after a short delay)",
    }
    name = reason.split(",")[0].split()[0] if reason.strip() else "None"
    if name in _never_starts(platform, options) or _PER_JOB_LIMIT.fullmatch(name):
        why = _never_text(name, platform, options)
        return f"SLURM {jobs} pending ({reason}) and can never start as asked: {why}", True
    why = next((text for key, text in waits.items() if reason.startswith(key)), "SLURM starts it when it can")
    return f"SLURM {jobs} pending ({reason}): {why}", False


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


def job_failure(n_nodes: int, ranks_per_node: int, state: str, outcomes: dict[int, NodeOutcome],
                node_errors: dict[int, str], ended: SlurmJobError) -> BaseException | None:
    """Why a SLURM job failed, or None, in this order: a rank's own failure on any node; a node's own error (its
    time limit); a node controller that raised (`node_errors`: their text); how SLURM ended the job (`ended`:
    cancelled, timed out, out of memory: what the ranks saw follows from it); a rank that only lost its peers;
    nodes that sent nothing."""
    ranks: Sequence[RankOutcome] = [rank for node in outcomes.values() for rank in node.ranks]
    cause = root_cause(ranks)
    errors = [node.error for _, node in sorted(outcomes.items()) if node.error is not None]
    if cause is not None and not cause.is_secondary:
        return _with_every_rank(failure(ranks), n_nodes, ranks_per_node, outcomes)
    if errors:  # (past the time limit, the report names the rank that held up the others on whichever node)
        return with_every_node(errors[0], ranks, errors) if isinstance(errors[0], JobTimedOut) else errors[0]
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


def _with_every_rank(made: RankFailure | None, n_nodes: int, ranks_per_node: int,
                     outcomes: dict[int, NodeOutcome]) -> RankFailure | None:
    """`made` listing every rank of the job, where a node sent none of its ranks' ends: its ranks as returned
    (`values`: they all did) or as stopped (it sent nothing: the failure elsewhere stopped it)."""
    if made is None:
        return None
    listed = {o.rank for o in made.outcomes}
    for node in range(n_nodes):
        returned = node in outcomes and not outcomes[node].ranks and outcomes[node].error is None
        made.outcomes += [RankOutcome(rank, node, RankResult(rank) if returned else None, 0 if returned else None,
                                      stopped=not returned)
                          for rank in range(node * ranks_per_node, (node + 1) * ranks_per_node) if rank not in listed]
    made.outcomes.sort(key=lambda o: o.rank)
    return made


def job_return(ret: JobReturn, n_nodes: int, ranks_per_node: int, state: str, outcomes: dict[int, NodeOutcome],
               node_errors: dict[int, str], ended: SlurmJobError) -> tuple[JobReturn, list[Any]]:
    """The JobReturn of one SLURM job and every rank's value; `ret`: node 0's JobReturn, else a FAILED shell."""
    made = job_failure(n_nodes, ranks_per_node, state, outcomes, node_errors, ended)
    if made is not None or ret.status is not JobStatus.COMPLETED:
        ret.status = JobStatus.FAILED
        ret.return_value = made if made is not None else ended
    return ret, [v for node in sorted(outcomes) for v in outcomes[node].values]
