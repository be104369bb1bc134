"""Hydra side of the SLURM launcher: submit the prepared jobs (equal sbatch parameters as one job array), wait
(polling sacct and the nodes' result files), and make each job's node outcomes one JobReturn. The manifest of the
submitted jobs (`ddpw_slurm_jobs.json`) is written as they are submitted; `fire_and_forget` returns then. A resumed
sweep waits for the jobs its earlier run submitted and never saw end, or collects them, instead of submitting them
again. With `fail_fast`, the first failed job cancels the others.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import OmegaConf

from ddpw_conf.launcher import SlurmLauncherConf
from ddpw_runtime import _compat
from ddpw_runtime.errors import SlurmJobError, Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob, task_config
from ddpw_runtime.hydra_jobs.summary import failed_summary, shown_path, use_colour
from ddpw_runtime.hydra_jobs.sweep_summary import SweepSummary, entry, fail_fast_line
from ddpw_runtime.hydra_jobs.task import DdpwJobReturn, raise_job_error
from ddpw_runtime.launch import pickling, signals
from ddpw_runtime.launch.console import ConsoleEcho, console_of, show
from ddpw_runtime.launch.job import Grace
from ddpw_runtime.launch.outcome import note_start
from ddpw_runtime.launch.payload import write_atomically
from ddpw_runtime.launch.rank_outcome import LOG_TAIL_LINES
from ddpw_runtime.slurm import outcomes as node_outcomes
from ddpw_runtime.slurm import sbatch

log = logging.getLogger(__name__)

MANIFEST = "ddpw_slurm_jobs.json"
"""The manifest of submitted jobs (SLURM job id, output dir, node logs per job)."""
_SUBMITTED = "SUBMITTED"
"""A job's status in the summary from its submission until it ends."""
_POLL_S = 0.5
_SACCT_MIN_S, _SACCT_MAX_S = 2.0, 30.0
_SQUEUE_WAIT_S = 30.0
"""The longest wait for squeue's answer (a resume asks it about a job sacct does not know yet)."""


@dataclass
class _Job:
    """One Hydra job on its way through SLURM."""

    prepared: PreparedJob
    params: dict[str, Any]
    slurm: Any = None
    """The submitit Job, once submitted."""
    submitted_at: float = 0.0
    """When it was submitted (`time.time()`): a job's time is from its submission to its end."""
    restarts: int = 0
    """SLURM's restart count as last seen (a requeue raises it)."""
    reasons: set[str] = field(default_factory=set)
    """The reasons it was pending for that the console has shown."""


@dataclass
class _Queued:
    """A job as squeue shows it while SLURM has it queued or running."""

    state: str
    restarts: int
    reason: str


def run_jobs(hydra_context: HydraContext, task_function: TaskFunction, prepared: Sequence[PreparedJob],
             options: SlurmLauncherConf, summary: SweepSummary) -> list[JobReturn]:
    """Submit `prepared` (checked) jobs, wait, and return what each ended with (in `summary` as each ends)."""
    sbatch.check_ports([(job.idx, job.platform) for job in prepared])
    folder = Path(options.submitit_folder).expanduser().absolute()
    jobs = [_Job(job, sbatch.sbatch_parameters(job.platform, options)) for job in prepared]
    if options.dry_run:
        _print_dry_run(_arrays(jobs), folder)
        return [_return(job, JobStatus.COMPLETED, None) for job in jobs]
    manifest = Path(str(prepared[0].config.hydra.sweep.dir)).absolute() / MANIFEST
    ended = _earlier_submissions(jobs, folder, manifest, summary) if options.resume else {}
    waiting = [job for job in jobs if job.prepared.idx not in ended]
    _submit(_arrays([job for job in waiting if job.slurm is None]), hydra_context, task_function, options, folder,
            manifest, summary)
    if options.fire_and_forget:
        log.info(f"Submitted {len(jobs)} job(s) and returning (fire_and_forget); manifest: {manifest}")
        return [ended.get(job.prepared.idx) or _return(job, JobStatus.COMPLETED, job.slurm.job_id) for job in jobs]
    # A lone job's console ranks are echoed here while it runs, as a local run shows them.
    shown = sbatch.console_logs(jobs[0].prepared.platform, jobs[0].prepared.output_dir) if len(jobs) == 1 else {}
    # Up to a rank's note of its error, written as the job ends (a local job's console stops as the first rank fails;
    # the job's error shows the rank that failed first).
    echo = ConsoleEcho(shown, console_of(sys.stdout), {rank: f"[rank {rank}] " for rank in shown if len(shown) > 1},
                       {rank: note_start(rank) for rank in shown})
    try:
        echo.start()
        with signals.jobs_running():  # (a Ctrl-C or SIGTERM is reported below, not as one that came with no job)
            ended.update(_wait(waiting, summary, options) if waiting else {})
    except KeyboardInterrupt:
        with signals.further(lambda: None):
            for job in waiting:
                job.slurm.cancel(check=False)
                if summary.entries[job.prepared.idx].status == _SUBMITTED:
                    _record(summary, job, "INTERRUPTED")
            log.error(f"Interrupted: cancelled SLURM job(s) {', '.join(job.slurm.job_id for job in waiting)}")
        raise SystemExit(130) from None
    except Terminated:  # the jobs are SLURM's (a login node's shutdown sends SIGTERM): they go on, as after a SIGKILL
        with signals.further(lambda: None):
            going = [job.slurm.job_id for job in waiting if summary.entries[job.prepared.idx].status == _SUBMITTED]
            if going:
                sweep_dir = manifest.parent
                sys.stderr.write(f"Terminated (SIGTERM): SLURM job(s) {', '.join(going)} go on without this program; "
                                 "collect them with the same command and hydra.launcher.resume=true "
                                 f"hydra.sweep.dir={sweep_dir}, or cancel them with scancel {' '.join(going)}\n")
            else:
                sys.stderr.write(signals.nothing_running(signal.SIGTERM))
        raise
    finally:
        echo.stop()
    return [ended[job.prepared.idx] for job in jobs]


def _record(summary: SweepSummary, job: _Job, status: str) -> None:
    """Note in `summary` that `job` is SUBMITTED, or never ended (INTERRUPTED, STOPPED, NOT STARTED: its time is
    from its submission, as an ended job's)."""
    p = job.prepared
    took = time.time() - job.submitted_at if status != _SUBMITTED and job.submitted_at else 0.0
    summary.record(entry(p.idx, p.overrides, p.output_dir, took, None, status))


def _earlier_submissions(jobs: list[_Job], folder: Path, manifest: Path, summary: SweepSummary) -> dict[int, JobReturn]:
    """On a resume, the jobs the earlier run submitted and never saw end (summary: SUBMITTED): one still queued or
    running is attached (`slurm` set) to be waited for, those that COMPLETED meanwhile are collected (returned, by
    job number), the others (failed, or unknown to sacct and squeue) are submitted again."""
    import submitit

    latest = {entry["job"]: entry for entry in _manifest_entries(manifest)}
    earlier = [job for job in jobs if job.prepared.idx in latest
               and getattr(summary.entries.get(job.prepared.idx), "status", _SUBMITTED) == _SUBMITTED]
    for job in earlier:
        job.slurm = submitit.SlurmJob(folder=folder, job_id=latest[job.prepared.idx]["slurm_job_id"],
                                      tasks=tuple(range(job.prepared.platform.n_nodes)))
        job.submitted_at = latest[job.prepared.idx].get("submitted_at", manifest.stat().st_mtime)  # (older runs)
    if earlier:
        _compat.refresh_sacct(earlier[0].slurm)
    collected: dict[int, JobReturn] = {}
    for job in earlier:
        p, state, ret = job.prepared, _compat.sacct_state(job.slurm), _ended(job)
        if ret is None and state == "UNKNOWN":  # sacct's accounting database may lag behind: squeue, not run twice
            queued = _queue([job.slurm.job_id]).get(job.slurm.job_id)
            state = queued.state if queued else state
        if ret is None and state != "UNKNOWN":
            log.info(f"#{p.idx} : {p.shown} -> waiting for SLURM job {job.slurm.job_id} ({state}), submitted by "
                     "the earlier run".replace(" :  -> ", " : -> "))
        elif ret is not None and ret.status is JobStatus.COMPLETED:
            log.info(f"#{p.idx} : SLURM job {job.slurm.job_id} of the earlier run COMPLETED meanwhile: collected")
            collected[p.idx] = ret
            ended_at = max(_compat.node_result_time(job.slurm.task(node)) for node in range(p.platform.n_nodes))
            summary.record(entry(p.idx, p.overrides, p.output_dir, ended_at - job.submitted_at, ret), ret)
        else:
            why = "sacct does not know it" if ret is None else "it did not complete"
            log.info(f"#{p.idx} : SLURM job {job.slurm.job_id} of the earlier run is submitted again ({why})")
            job.slurm = None
    return collected


def _queue(job_ids: list[str]) -> dict[str, _Queued]:
    """squeue's view of the jobs `job_ids` (array tasks one by one) that SLURM has queued or running, by job id; none
    where squeue does not answer."""
    try:
        shown = subprocess.run(["squeue", "--noheader", "--array", f"--jobs={','.join(job_ids)}",
                                "--Format=JobArrayID:|,State:|,RestartCnt:|,Reason:|"], capture_output=True, text=True,
                               timeout=_SQUEUE_WAIT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split("|") for line in shown.stdout.splitlines()] if shown.returncode == 0 else []
    return {row[0]: _Queued(row[1], int(row[2]), row[3]) for row in rows if len(row) == 5 and row[2].isdigit()}


def _arrays(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs grouped by equal sbatch parameters, in order of first appearance: one submission each."""
    groups: dict[str, list[_Job]] = {}
    for job in jobs:
        groups.setdefault(json.dumps(job.params, sort_keys=True, default=str), []).append(job)
    return list(groups.values())


def _print_dry_run(groups: list[list[_Job]], folder: Path) -> None:
    for group in groups:
        numbers = ", ".join(f"#{job.prepared.idx}" for job in group)
        kind = f"one job array of {len(group)} jobs ({numbers})" if len(group) > 1 else f"job {numbers}"
        print(f"=== sbatch script for {kind} (dry run, nothing submitted)\n"
              f"{sbatch.sbatch_script(group[0].params, folder, len(group))}")
        for job in group:
            p = job.prepared
            print(f"--- job #{p.idx}: {p.shown or '(no overrides)'}: launch plan on each node\n"
                  f"{sbatch.describe(p.platform, p.output_dir, p.config.hydra.job.env_set)}")


def _submit(groups: list[list[_Job]], hydra_context: HydraContext, task_function: TaskFunction,
            options: SlurmLauncherConf, folder: Path, manifest: Path, summary: SweepSummary) -> None:
    """Submit each group (one job array each); add its jobs to `manifest` and `summary` (SUBMITTED) right after, so
    that a resume finds every submitted job."""
    import submitit

    from ddpw_runtime.procs.slurm_node import SlurmNode

    state = pickling.dumps(_compat.hydra_state())
    grace = Grace(options.stop_grace_s, options.interrupt_grace_s)
    submitted: list[_Job] = []
    for group in groups:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=options.max_restarts)
        executor.update_parameters(**group[0].params)
        nodes = [SlurmNode(job=pickling.dumps((hydra_context, task_function, job.prepared.config)),
                           idx=job.prepared.idx, hydra_state=state, sys_path=list(sys.path),
                           platform=sbatch.node_platform(job.prepared.platform), dir_keys=job.prepared.dir_keys,
                           max_restarts=options.max_restarts, grace=grace)
                 for job in group]
        try:
            # (submitit prints sbatch's refusal too: it is shown once, below, with what to change)
            with contextlib.redirect_stderr(io.StringIO()), executor.batch():
                slurm_jobs = [executor.submit(node) for node in nodes]
        except Exception as exc:
            # Nothing half-submitted stays behind: the jobs submitted before this one are cancelled, and the summary
            # says that none of them started (not SUBMITTED: that is a sweep whose process was killed), nor the rest.
            for job in submitted:
                job.slurm.cancel(check=False)
            for job in (job for group_jobs in groups for job in group_jobs) if submitted else ():
                _record(summary, job, "NOT STARTED")
            numbers = ", ".join(f"#{job.prepared.idx}" for job in group)
            fix = node_outcomes.sbatch_refusal(str(exc), group[0].prepared.platform, options)
            raise SlurmJobError(f"SLURM refused job(s) {numbers}: {fix + chr(10) if fix else ''}{exc}") from None
        for job, slurm_job in zip(group, slurm_jobs, strict=True):
            job.slurm, job.submitted_at = slurm_job, time.time()
            submitted.append(job)
            p = job.prepared
            log.info(f"#{p.idx} : {p.shown} -> SLURM job {slurm_job.job_id} ({p.platform.n_nodes} node(s) x "
                     f"{p.platform.ranks_per_node} rank(s), {node_outcomes.partition(p.platform)}); output: "
                     f"{p.output_dir}"
                     .replace(" :  -> ", " : -> "))
        _write_manifest(manifest, group)
        for job in group:
            _record(summary, job, _SUBMITTED)


def _manifest_entries(path: Path) -> list[dict[str, Any]]:
    """The jobs the manifest `path` lists, in submission order (none where there is none)."""
    return list(json.loads(path.read_text())["jobs"]) if path.exists() else []


def _write_manifest(path: Path, jobs: list[_Job]) -> None:
    """Add the submitted jobs to the manifest (a sweep may call the launcher more than once)."""
    entries = _manifest_entries(path) + [
        {"job": job.prepared.idx, "overrides": job.prepared.overrides, "slurm_job_id": job.slurm.job_id,
         "output_dir": str(job.prepared.output_dir), "node_logs": str(job.slurm.paths.folder),
         "submitted_at": job.submitted_at}
        for job in jobs
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (json.dumps({"jobs": entries}, indent=2) + "\n").encode(), 0o644)


def _wait(jobs: list[_Job], summary: SweepSummary, options: SlurmLauncherConf) -> dict[int, JobReturn]:
    """Wait until every job has ended (all its nodes sent their outcome of the same run, or sacct says it ended),
    noting each in `summary`; the JobReturns by job number. Result files are checked often, sacct less and less."""
    returns: dict[int, JobReturn] = {}
    pending = list(jobs)
    start = next_sacct = time.monotonic()
    while True:
        now = time.monotonic()
        never: dict[int, JobReturn] = {}
        if now >= next_sacct:
            _compat.refresh_sacct(jobs[0].slurm)
            never = _watch_queue(pending, options)
            next_sacct = now + min(_SACCT_MAX_S, max(_SACCT_MIN_S, (now - start) / 10))
        for job in list(pending):
            ret = never.get(job.prepared.idx) or _ended(job)
            if ret is not None:
                pending.remove(job)
                p = job.prepared
                returns[p.idx] = ret
                duration = time.time() - job.submitted_at
                summary.record(entry(p.idx, p.overrides, p.output_dir, duration, ret), ret)
                error = _compat.job_error(ret)
                if error is not None:  # reported as it fails, as a local sweep reports it
                    logs = None if p.idx in never else shown_path(p.output_dir, Path.cwd())
                    show(failed_summary(p.idx, error, duration, logs, use_colour(sys.stdout), job.restarts,
                                        options.max_restarts), sys.stdout)
                if options.fail_fast and ret.status is JobStatus.FAILED:
                    _fail_fast(p.idx, ret, pending, summary)
        if not pending:
            return returns
        time.sleep(_POLL_S)


def _watch_queue(jobs: list[_Job], options: SlurmLauncherConf) -> dict[int, JobReturn]:
    """Say on the console, once, why a job of `jobs` is pending, and that a job was requeued; cancel each job that can
    never start as it is (its partition's limits, its account or QOS refuse it). Their FAILED JobReturns by number."""
    queued = _queue([job.slurm.job_id for job in jobs])
    never: dict[int, JobReturn] = {}
    waiting: dict[str, list[_Job]] = {}  # by reason: one line for the jobs of an array
    for job in jobs:
        seen, p = queued.get(job.slurm.job_id), job.prepared
        if seen is None:
            continue
        _note_restarts(job, seen.restarts)
        if seen.state != "PENDING" or seen.reason in job.reasons or seen.reason in ("None", ""):
            continue
        job.reasons.add(seen.reason)
        line, never_starts = node_outcomes.pending_reason([job.slurm.job_id], seen.reason, p.platform, options)
        if never_starts:
            job.slurm.cancel(check=False)
            never[p.idx] = _return(job, JobStatus.FAILED, SlurmJobError(f"{line}. It was cancelled."))
        else:
            waiting.setdefault(seen.reason, []).append(job)
    for reason, group in waiting.items():
        idxs = [f"#{job.prepared.idx}" for job in group]
        line, _ = node_outcomes.pending_reason([job.slurm.job_id for job in group], reason, group[0].prepared.platform,
                                               options)
        log.info(f"{', '.join(idxs) if len(idxs) <= 3 else f'{idxs[0]} ... {idxs[-1]}'} : {line}")
    return never


def _note_restarts(job: _Job, restarts: int) -> None:
    """Say on the console that `job` was requeued, where SLURM's restart count `restarts` is above the last seen."""
    if restarts > job.restarts:
        job.restarts = restarts
        log.info(f"#{job.prepared.idx} : SLURM job {job.slurm.job_id} was requeued (restart {restarts}): it resumes "
                 "when SLURM starts it again")


def _fail_fast(failed: int, ret: JobReturn, pending: list[_Job], summary: SweepSummary) -> NoReturn:
    """Job `failed` failed (`ret`) with `fail_fast`: cancel the `pending` jobs and raise its error."""
    queued = [job for job in pending if _compat.sacct_state(job.slurm).split()[0] == "PENDING"]
    sys.stderr.write(fail_fast_line(failed, [job.prepared.idx for job in pending if job not in queued],
                                    [job.prepared.idx for job in queued]) + "\n")
    for job in pending:
        job.slurm.cancel(check=False)
        _record(summary, job, "NOT STARTED" if job in queued else "STOPPED")
    raise_job_error(ret)


def _ended(job: _Job) -> JobReturn | None:
    """The job's JobReturn once it has ended (see `_wait`), else None."""
    state = _compat.sacct_state(job.slurm)
    ended = state.split()[0] not in node_outcomes.INCOMPLETE_STATES
    tasks = [job.slurm.task(node) for node in range(job.prepared.platform.n_nodes)]
    if not ended and not all(_compat.node_result_ready(task) for task in tasks):
        return None
    outcomes: dict[int, node_outcomes.NodeOutcome] = {}
    errors: dict[int, str] = {}  # the error text of every node controller that raised
    for node, task in enumerate(tasks):
        if not _compat.node_result_ready(task):
            continue
        try:
            outcomes[node] = task.result()
        except Exception as exc:  # submitit's FailedJobError carries the controller's traceback
            errors[node] = str(exc)
    restarts = max((o.attempt for o in outcomes.values()), default=0)
    _note_restarts(job, restarts)  # (a requeue between two looks at squeue)
    outcomes = {node: o for node, o in outcomes.items() if o.attempt == restarts}  # the latest run's only
    if not ended and (errors or len(outcomes) < len(tasks)):
        return None  # a result left by an earlier run of a requeued job; wait for this run's
    state = state if ended else ""  # every node returned; SLURM may not have recorded the end yet
    log.info(f"#{job.prepared.idx} : SLURM job {job.slurm.job_id} ended ({state or 'every node returned'})")
    node0 = outcomes.get(0)
    ret = node0.job_return if node0 and node0.job_return else _return(job, JobStatus.FAILED, None)
    slurm_end = node_outcomes.state_error(job.slurm.job_id, state, str(job.slurm.paths.folder), restarts)
    if not outcomes and not errors and not state.startswith(("CANCELLED", "TIMEOUT")):
        slurm_end = SlurmJobError(f"{slurm_end}{_stderr_tail(job)}")
    ret, values = node_outcomes.job_return(ret, job.prepared.platform.n_nodes, job.prepared.platform.ranks_per_node,
                                              state, outcomes, errors, slurm_end)
    return DdpwJobReturn.of(ret, values, job.restarts)


def _stderr_tail(job: _Job) -> str:
    """The last lines of node 0's stderr (where a controller that could not start says why)."""
    try:
        lines = job.slurm.task(0).paths.stderr.read_text(errors="backslashreplace").splitlines()
    except OSError:
        return ""
    return "\nlast lines of node 0's stderr:\n" + "\n".join(lines[-LOG_TAIL_LINES:]) if lines else ""


def _return(job: _Job, status: JobStatus, value: Any) -> DdpwJobReturn:
    """A JobReturn made here, for a job whose node 0 sent none (dry run, fire and forget, no result)."""
    config = job.prepared.config
    return DdpwJobReturn(overrides=job.prepared.overrides, cfg=task_config(config),
                         hydra_cfg=OmegaConf.create({"hydra": config.hydra}), working_dir=str(job.prepared.output_dir),
                         task_name=str(config.hydra.job.name), status=status, _return_value=value)
