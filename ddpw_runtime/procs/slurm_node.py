"""What runs on each node of a SLURM job: its controller (`SlurmNode`, one submitit task per node) starts its ranks
with the local engine and returns a `NodeOutcome`; node 0's runs Hydra's `run_job`. SIGTERM and SLURM's warning
(SIGUSR2): docs/slurm.md, "Preemption, time limits and checkpoints" and "Signals". A node whose own ranks failed first
sends SIGTERM to the job's other nodes."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from ddpw_conf import ConfigError, Platform
from ddpw_runtime import _compat
from ddpw_runtime.errors import JobTimedOut, SlurmJobError, Terminated, TimeLimitNear
from ddpw_runtime.hydra_jobs.prepare import task_config
from ddpw_runtime.hydra_jobs.task import JobTask
from ddpw_runtime.launch.checks import check
from ddpw_runtime.launch.job import Grace, NodeJob, starter_for
from ddpw_runtime.launch.outcome import root_cause
from ddpw_runtime.launch.records import portable
from ddpw_runtime.rank.environment import RESTART_COUNT_ENV
from ddpw_runtime.slurm.outcomes import NodeOutcome
from ddpw_runtime.slurm.sbatch import rendezvous

log = logging.getLogger(__name__)


_REQUEUE_WAIT_S = 300.0
"""How long a node waits for SLURM to stop it after the job was requeued (SLURM's own KillWait is
seconds); past it the node ends by itself, without a result of this run."""


class Preempted(Terminated):
    """SLURM warned the job (SIGUSR2) and it will be requeued: raised in the controller to stop its ranks."""


@dataclass
class SlurmNode:
    """The callable submitit runs as every node's task, resubmitted unchanged when the job is requeued. `job`
    (`pickling.dumps` of hydra_context, task_function, job config) is read only after Hydra's state is restored, with
    the submitting program's `sys_path` added. `platform` is the job's, with the CPUs it asks SLURM for filled in."""

    job: bytes
    idx: int
    """The job's number in its sweep."""
    hydra_state: bytes
    sys_path: list[str]
    platform: Platform
    dir_keys: tuple[str, str | None]
    max_restarts: int
    grace: Grace

    def __call__(self) -> NodeOutcome:
        """Run this node's part of the job; its outcome (never raises for a failure of its ranks)."""
        import submitit

        return _NodeRun(self, submitit.JobEnvironment()).run()

    def checkpoint(self) -> Any:
        """submitit's requeue hook, called on node 0 after SLURM's warning: this same callable while a restart is left
        (the job is requeued), else None."""
        from submitit.helpers import DelayedSubmission

        return None if _attempt() >= self.max_restarts else DelayedSubmission(self)


def _attempt() -> int:
    """SLURM's restart count of this job (0 on its first run)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


class _NodeRun:
    """One run of a node's controller; the state of its signal handling lives here, not in `SlurmNode`."""

    def __init__(self, spec: SlurmNode, env: Any) -> None:
        self.spec = spec
        self.env = env
        self.node: int = env.node
        self.attempt = _attempt()
        self.warned = False
        """SLURM's warning came (while its ranks ran, or with a restart left: then the job is being requeued)."""
        self.in_ranks = False
        self.done = False
        """This node has its outcome; SIGTERM no longer stops it."""

    def run(self) -> NodeOutcome:
        os.environ[RESTART_COUNT_ENV] = str(self.attempt)
        # SLURM's warning first: it may come while the job loads (its script imports torch, seconds on a busy node;
        # SLURM sends it up to a minute early), and submitit's handler then ended the node ("Job not requeued
        # because: timed-out too many times") instead of the job running on to its own time limit.
        submitit_warning = signal.getsignal(signal.SIGUSR2)  # checkpoint() and `scontrol requeue`
        signal.signal(signal.SIGUSR2, self._on_warning)
        hydra_context, task_function, config = self._load()
        try:  # what the submitting host could not ask: this node's GPUs and torch
            check(self.spec.platform)
        except ConfigError as exc:
            return NodeOutcome.failed(self.node, self.attempt, exc)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        _start_rank_starter(self.spec.platform)
        try:
            outcome = self._run_job(hydra_context, task_function, config)
        except Preempted:
            self._requeue(submitit_warning)
        except TimeLimitNear:  # it came just before or after the ranks' supervision (else that stops them, reporting)
            outcome = NodeOutcome.failed(self.node, self.attempt, JobTimedOut(self.spec.platform.timeout_min, {},
                                                                              warned=True))
        self.done = True
        # This node failed on its own (not its ranks only losing peers elsewhere): SIGTERM to the other nodes. Not past
        # the time limit: every node's own stops its ranks, taking where each was (the rank holding the others up may
        # be on another node; a SIGTERM there would end it without its place).
        cause = root_cause(outcome.ranks)
        own = outcome.error is not None or cause is not None and not cause.is_secondary
        if self.spec.platform.n_nodes > 1 and own and not isinstance(outcome.error, JobTimedOut):
            result = subprocess.run(["scancel", "--signal=TERM", self.env.job_id], capture_output=True, text=True,
                                    timeout=60, check=False)
            if result.returncode != 0:
                log.warning("could not stop the job's other nodes: %s", result.stderr.strip())
        return outcome

    def _load(self) -> tuple[Any, Any, Any]:
        """Hydra's state first, then the job (its config needs the state to unpickle)."""
        from hydra.core.utils import setup_globals
        from omegaconf import open_dict, read_write

        sys.path[:0] = [path for path in self.spec.sys_path if path not in sys.path]
        _compat.restore_hydra_state(pickle.loads(self.spec.hydra_state))
        setup_globals()
        hydra_context, task_function, config = pickle.loads(self.spec.job)
        with read_write(config.hydra.job), open_dict(config.hydra.job):
            config.hydra.job.id = self.env.job_id
        return hydra_context, task_function, config

    def _run_job(self, hydra_context: Any, task_function: Any, config: Any) -> NodeOutcome:
        from hydra.core.utils import run_job

        platform = self.spec.platform if self.node == 0 else replace(self.spec.platform, upon_finish=None)
        master_addr, master_port = rendezvous(platform, self.env.hostnames[0], self.env.raw_job_id)
        job = NodeJob(platform, Path("."), self.spec.grace, self.node, master_addr, master_port,
                      run_id=self.env.job_id, max_restarts=self.spec.max_restarts, restart_count=self.attempt,
                      restart_on_failure=False)
        task = JobTask(task_function, job, self.spec.idx, announce=False, around_ranks=self._ranks_run)
        key, subkey = self.spec.dir_keys
        if self.node == 0:
            ret = run_job(hydra_context=hydra_context, task_function=task, config=config, job_dir_key=key,
                          job_subdir_key=subkey)
            error = _compat.job_error(ret)
            if error is not None:
                ret.return_value = portable(error, SlurmJobError)
                return replace(NodeOutcome.failed(0, self.attempt, error), job_return=ret)
            return NodeOutcome(0, self.attempt, task.values, job_return=ret)
        with _entered(config, key, subkey) as task_cfg:
            try:
                task(task_cfg)
            except Exception as exc:  # the outcome carries it to the submitting side
                return NodeOutcome.failed(self.node, self.attempt, exc)
        return NodeOutcome(self.node, self.attempt, task.values)

    @contextmanager
    def _ranks_run(self) -> Iterator[None]:
        """While this node's ranks run: SLURM's warning stops them (`Preempted`) for a requeue."""
        self.in_ranks = True
        try:
            if self.warned and self.attempt < self.spec.max_restarts:
                raise Preempted()
            yield
        finally:
            self.in_ranks = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if not (self.warned or self.done):
            raise Terminated()

    def _on_warning(self, signum: int, frame: Any) -> None:
        if self.warned:
            return
        if self.attempt >= self.spec.max_restarts:
            if not self.in_ranks:
                log.warning("SLURM warned the job (SIGUSR2: its time limit is near, or it is preempted) while its "
                            "ranks did not run; no restart is left (hydra.launcher.max_restarts=%d), so it runs on "
                            "until SLURM stops it", self.spec.max_restarts)
                return
            self.warned = True
            log.warning("SLURM warned the job (SIGUSR2: its time limit is near, or it is preempted) and no restart is "
                        "left (hydra.launcher.max_restarts=%d): its ranks are stopped as at the time limit, where each "
                        "was taken first", self.spec.max_restarts)
            raise TimeLimitNear()  # (SIGTERM no longer stops this node: see `_on_sigterm`)
        self.warned = True
        # The SIGTERM that SLURM sends after its warning must not cut the ranks' saving short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("SLURM warned the job (SIGUSR2): the ranks get SIGTERM to save, then the job is requeued "
                    "(restart %d of %d)", self.attempt + 1, self.spec.max_restarts)
        if self.in_ranks:
            raise Preempted()

    def _requeue(self, submitit_warning: Any) -> NoReturn:
        """After the ranks stopped for SLURM's warning: node 0 requeues the job (submitit calls `checkpoint()`, runs
        `scontrol requeue`, exits); the others wait for SLURM to stop them, leaving no result of this run behind."""
        if self.node == 0:
            submitit_warning(signal.SIGUSR2, None)
        time.sleep(_REQUEUE_WAIT_S)
        log.error("SLURM did not stop this node %.0f s after the job was requeued; it ends without a result",
                  _REQUEUE_WAIT_S)
        os._exit(1)


def _start_rank_starter(platform: Platform) -> None:
    """Start this process's rank starter now, with SIGTERM and SIGUSR2 ignored (SLURM sends them to every process of
    the job; the starter must outlive them so its ranks can save) and SIGCONT at its default (submitit's handler would
    log it in every rank)."""
    dispositions = {signal.SIGTERM: signal.SIG_IGN, signal.SIGUSR2: signal.SIG_IGN, signal.SIGCONT: signal.SIG_DFL}
    saved = {sig: signal.signal(sig, disposition) for sig, disposition in dispositions.items()}
    try:
        starter_for(platform)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextmanager
def _entered(config: Any, dir_key: str, subdir_key: str | None) -> Iterator[Any]:
    """Enter the job as `run_job` does on node 0 (HydraConfig with the output dir, working dir, `env_set`), without
    `.hydra/`, the job log or callbacks; yields the task's config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log, env_override
    from omegaconf import OmegaConf, open_dict, read_write

    output_dir = str(OmegaConf.select(config, dir_key))
    if subdir_key is not None:
        output_dir = os.path.join(output_dir, str(OmegaConf.select(config, subdir_key)))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(output_dir)
    HydraConfig.instance().set_config(config)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    task_cfg = task_config(config)
    if config.hydra.job.chdir:
        os.chdir(output_dir)
    with env_override(config.hydra.job.env_set):
        yield task_cfg

