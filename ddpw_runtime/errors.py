"""The errors a user of hydra-ddpw may catch: `CompactError`s, whose message Hydra prints alone (it carries
everything worth showing); importing them imports nothing of Hydra."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ddpw_conf.errors import CompactError

if TYPE_CHECKING:
    from ddpw_runtime.launch.rank_outcome import RankOutcome
    from ddpw_runtime.launch.records import RankResult
    from ddpw_runtime.launch.stacks import HangReport


_CAUSE_CHARS = 300  # the most of a root cause's message that a line naming it shows (its traceback has it all)


class RankFailure(CompactError, RuntimeError):
    """A distributed job failed; describes the rank that failed first (the root cause): `rank`, `node`, `exit_code`,
    `error_type`, `error_message`, `traceback_text`, `log_tail` (its log's end when it died without a traceback),
    `log_file`; `outcomes`: every rank's `RankOutcome` (`results` and `exit_codes` are views of it). When a collective
    timed out, the root cause is the rank not in it (`error_type` `NotInCollective`, or `CollectiveMismatch` when all
    waited in different ones): `hang` says where every rank was, `waiting_error` what the waiting rank raised. The
    original exception is `__cause__` when it could be sent back."""

    def __init__(self, rank: int, node: int, exit_code: int | None, error_type: str, error_message: str,
                 traceback_text: str = "", log_tail: str = "", log_file: str | None = None,
                 outcomes: Sequence[RankOutcome] = (), hang: HangReport | None = None, waiting_error: str = "") -> None:
        self.rank = rank
        self.node = node
        self.exit_code = exit_code
        self.error_type = error_type
        self.error_message = error_message
        self.traceback_text = traceback_text
        self.log_tail = log_tail
        self.log_file = log_file
        self.outcomes = list(outcomes)
        self.hang = hang
        self.waiting_error = waiting_error
        super().__init__(self._describe())

    @property
    def cause(self) -> str:
        """`Type: message` of the root cause in one line: the message's first line (a DataLoader worker's error holds
        its whole traceback), cut at `_CAUSE_CHARS`."""
        return self._cause(cut=True)

    def _cause(self, cut: bool) -> str:
        """`cause`, its message's first line cut at `_CAUSE_CHARS` only if `cut`."""
        first = next((line for line in self.error_message.splitlines() if line.strip()), "")
        if cut and len(first) > _CAUSE_CHARS:  # (a message of megabytes would fill the console in every line naming it)
            first = f"{first[:_CAUSE_CHARS]}... ({len(first) - _CAUSE_CHARS} characters more)"
        return f"{self.error_type}: {first}" if first else self.error_type

    @property
    def results(self) -> list[RankResult | None]:
        """What every rank sent back, by rank (None for ranks that sent nothing)."""
        return [outcome.result for outcome in self.outcomes]

    @property
    def exit_codes(self) -> dict[int, int]:
        """Every rank's exit code by rank, where known (negative: killed by that signal)."""
        return {o.rank: o.exit_code for o in self.outcomes if o.exit_code is not None}

    def _describe(self) -> str:
        # The first line is whole where no traceback below shows the message (a fix at its end is not cut off).
        parts = [f"rank {self.rank} (node {self.node}) failed: {self._cause(cut=bool(self.traceback_text))}"]
        if self.hang is not None:
            parts.append(self.hang.text())
        if self.waiting_error:
            parts.append(f"what a waiting rank raised (secondary): {self.waiting_error}")
        rest = self.error_message.strip().partition("\n")[2]
        if self.traceback_text:
            parts.append(f"--- traceback of rank {self.rank} ---\n{self.traceback_text.rstrip()}")
        elif rest:
            parts.append(rest)
        if not self.traceback_text and self.log_tail:
            parts.append(f"--- end of rank {self.rank}'s log ---\n{self.log_tail.rstrip()}")
        if self.log_file:
            parts.append(f"(full output of rank {self.rank}: {self.log_file})")
        return "\n".join(parts)


class JobTimedOut(CompactError, RuntimeError):
    """The job ran past `platform.timeout_min` (or, `stalled`, made no progress for `platform.stall_timeout_min` with
    `platform.stop_on_stall`; or, `warned`, SLURM warned it that its time limit was near and no restart was left) and
    was stopped; `where`: each rank's place before any was stopped; `report` also says which ranks held up the
    others."""

    def __init__(self, timeout_min: float, where: dict[int, str], report: HangReport | None = None,
                 stalled: bool = False, warned: bool = False) -> None:
        self.timeout_min = timeout_min
        self.where = where
        self.report = report
        self.stalled = stalled
        self.warned = warned
        # what happened, in one clause (the message goes on with where each rank was)
        self.head = head = (
            "the job made no progress and was stopped (platform.stop_on_stall=true)" if stalled else
            f"SLURM warned the job that its time limit (platform.timeout_min={timeout_min}) was near, or that it was "
            "preempted, and no restart was left (hydra.launcher.max_restarts): it was stopped" if warned else
            f"the job ran past its time limit (platform.timeout_min={timeout_min}) and was stopped")
        if report is not None:
            lines = [f"{head}; {report.text()}"]
        else:
            lines = [f"{head}; where each rank was:", *(f"  {line}" for line in self.places)]
        super().__init__("\n".join(lines))

    @property
    def places(self) -> list[str]:
        """Where each rank was, a line per rank (those that held up the others first, `report.lines()`)."""
        if self.report is not None:
            return self.report.lines()
        return [f"rank {rank}: {place}" for rank, place in sorted(self.where.items())]


class SlurmJobError(CompactError, RuntimeError):
    """A SLURM job ended without every node's result (cancelled, timed out, out of memory, a node lost or its
    controller failed); the message says which, and where the logs are."""


class NodeError(CompactError, RuntimeError):
    """A job across machines (`platform.n_nodes` > 1, local launcher) could not run on all its nodes: one never joined,
    node 0 was not reached, or another node stopped the job; the message names the node (and address, port)."""


class NodeLost(NodeError):
    """A node never joined, or could no longer be reached: in a multirun node 0 starts no more jobs, each of which
    would wait for it. `nodes`: the nodes lost (none known when a node ran another command)."""

    def __init__(self, message: str, nodes: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)


class RankStopped(Exception):
    """Raised inside a rank in the caller's own process (a plain run's rank 0, `Wrapper(caller_rank=True)`) when the
    job is stopped around it (another rank or node failed or was lost, or the time limit passed); the job's error names
    the cause."""

    def __init__(self) -> None:
        super().__init__("the job was stopped (another rank or node failed or was lost, or the job reached its time "
                         "limit); this rank was stopped with it (the job's error names the cause)")


class Interrupted(SystemExit, KeyboardInterrupt):
    """Ctrl-C in a plain run: raised in the task as a KeyboardInterrupt (to save a checkpoint, say); uncaught, the
    program exits 130 without a traceback, as after every rank was given the signal and stopped."""

    def __init__(self) -> None:
        super().__init__(130)


class Terminated(SystemExit):
    """The controller received SIGTERM and its ranks were stopped; uncaught, it exits 143 as SIGTERM's kill would."""

    def __init__(self) -> None:
        super().__init__(143)


class TimeLimitNear(Terminated):
    """SLURM warned a job with no restart left that its time limit is near (or that it is preempted): raised in a
    node's controller, which stops its ranks as at the time limit, where each was taken first (`JobTimedOut`)."""
