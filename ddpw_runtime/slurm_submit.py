"""Hydra side of the SLURM launcher: compose and check every job, submit, wait, report.

Every job's `platform` and the launcher options are validated before anything is submitted. Jobs with
the same sbatch parameters go out as one job array, the others as separate submissions. Each node of a
job runs `SlurmNode` (see `slurm_node.py`). The submitting process waits for every job (polling sacct
and the nodes' result files), then turns each job's node outcomes into one JobReturn. A manifest of the
submitted jobs (`ddpw_slurm_jobs.json` in the sweep dir) is always written; `fire_and_forget` returns
right after it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ddpw_conf import Platform, platform_from_config
from ddpw_conf.launcher import SlurmLauncherConf
from ddpw_conf.run_mode import lone_run
from ddpw_runtime import hydra_state, slurm_results, slurm_script
from ddpw_runtime.console import ConsoleEcho

log = logging.getLogger(__name__)

MANIFEST = "ddpw_slurm_jobs.json"
"""The manifest of submitted jobs (SLURM job id, output dir, node logs per job), in the sweep dir."""
_POLL_S = 0.5
_SACCT_MIN_S, _SACCT_MAX_S = 2.0, 30.0
_LOG_TAIL_LINES = 20


@dataclass
class _Job:
    """One Hydra job on its way through SLURM."""

    idx: int
    overrides: List[str]
    config: DictConfig
    platform: Platform
    output_dir: Path
    params: Dict[str, Any]
    slurm: Any = None
    """The submitit Job, once submitted."""
    state: str = ""
    """How SLURM ended the job (a sacct state), or "" when every node returned before sacct said so."""
    outcomes: Dict[int, slurm_results.NodeOutcome] = field(default_factory=dict)
    node_errors: Dict[int, str] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        return " ".join(filter_overrides(self.overrides))


def launch(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    options: SlurmLauncherConf,
) -> List[JobReturn]:
    """Run each job of a batch on SLURM; one JobReturn per job, in order."""
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    options.validate()
    # A lone job of a plain run (the `ddpw` node points the sweep dir at the run dir) lands in the run
    # dir itself, where a normal run would put it.
    run_like = lone_run(config, len(job_overrides), initial_job_idx)
    jobs = [
        _prepare(hydra_context, config, list(overrides), idx, run_like, options)
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx)
    ]
    groups = _arrays(jobs)
    folder = Path(options.submitit_folder).expanduser().absolute()
    if options.dry_run:
        _print_dry_run(groups, folder)
        return [_return(job, JobStatus.COMPLETED, None) for job in jobs]
    _submit(groups, hydra_context, task_function, options, folder, run_like)
    manifest = _write_manifest(Path(str(config.hydra.sweep.dir)), jobs)
    if options.fire_and_forget:
        log.info(f"Submitted {len(jobs)} job(s) and returning (fire_and_forget); manifest: {manifest}")
        return [_return(job, JobStatus.COMPLETED, job.slurm.job_id) for job in jobs]
    # A lone job's console ranks are echoed here while it runs, as a local run shows them.
    shown = slurm_script.console_logs(jobs[0].platform, jobs[0].output_dir) if len(jobs) == 1 else {}
    try:
        with ConsoleEcho(shown):
            _wait(jobs)
    except KeyboardInterrupt:
        for job in jobs:
            job.slurm.cancel(check=False)
        log.error(f"Interrupted: cancelled SLURM job(s) {', '.join(job.slurm.job_id for job in jobs)}")
        raise SystemExit(130) from None
    return [_collect(job) for job in jobs]


def _prepare(
    hydra_context: HydraContext, config: DictConfig, overrides: List[str], idx: int, run_like: bool,
    options: SlurmLauncherConf,
) -> _Job:
    """Compose job `idx`, validate its platform, and pin its output dir in its config (resolved here,
    once, so every node and every restart writes to the same place)."""
    from ddpw_runtime.engine import resolve_callable

    sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = idx
        sweep_config.hydra.job.num = idx
    platform = platform_from_config(OmegaConf.select(sweep_config, "platform")).validate()
    options.validate_platform(platform)
    if platform.upon_finish:
        resolve_callable("platform.upon_finish", platform.upon_finish)
    output_dir = _pin_output_dir(sweep_config, run_like)
    return _Job(idx, overrides, sweep_config, platform, output_dir, slurm_script.sbatch_parameters(platform, options))


def _pin_output_dir(sweep_config: DictConfig, run_like: bool) -> Path:
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(sweep_config)
    try:
        hydra = sweep_config.hydra
        dirs = {"run": str(hydra.run.dir), "sweep": str(hydra.sweep.dir), "subdir": str(hydra.sweep.subdir)}
    finally:
        HydraConfig.instance().cfg = saved  # type: ignore[assignment]
    with read_write(sweep_config.hydra), open_dict(sweep_config.hydra):
        sweep_config.hydra.run.dir = dirs["run"]
        sweep_config.hydra.sweep.dir = dirs["sweep"]
        sweep_config.hydra.sweep.subdir = dirs["subdir"]
    return Path(dirs["run"] if run_like else str(Path(dirs["sweep"]) / dirs["subdir"])).absolute()


def _arrays(jobs: List[_Job]) -> List[List[_Job]]:
    """Jobs grouped by equal sbatch parameters, in order of first appearance: one submission each."""
    groups: Dict[str, List[_Job]] = {}
    for job in jobs:
        groups.setdefault(json.dumps(job.params, sort_keys=True, default=str), []).append(job)
    return list(groups.values())


def _print_dry_run(groups: List[List[_Job]], folder: Path) -> None:
    for group in groups:
        numbers = ", ".join(f"#{job.idx}" for job in group)
        kind = f"one job array of {len(group)} jobs ({numbers})" if len(group) > 1 else f"job {numbers}"
        print(f"=== sbatch script for {kind} (dry run, nothing submitted)\n"
              f"{slurm_script.sbatch_script(group[0].params, folder, len(group))}")
        for job in group:
            print(f"--- job #{job.idx}: {job.shown or '(no overrides)'}: launch plan on each node\n"
                  f"{slurm_script.describe(job.platform, job.output_dir)}")


def _submit(
    groups: List[List[_Job]],
    hydra_context: HydraContext,
    task_function: TaskFunction,
    options: SlurmLauncherConf,
    folder: Path,
    run_like: bool,
) -> None:
    import submitit

    from ddpw_runtime.slurm_node import SlurmNode

    state = hydra_state.pack()
    submitted: List[_Job] = []
    for group in groups:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=options.max_restarts)
        executor.update_parameters(**group[0].params)
        nodes = [
            SlurmNode(
                job=cloudpickle.dumps((hydra_context, task_function, job.config)),
                hydra_state=state,
                sys_path=list(sys.path),
                platform=slurm_script.node_platform(job.platform),
                run_like=run_like,
                max_restarts=options.max_restarts,
                stop_grace_s=options.stop_grace_s,
                interrupt_grace_s=options.interrupt_grace_s,
            )
            for job in group
        ]
        try:
            with executor.batch():
                slurm_jobs = [executor.submit(node) for node in nodes]
        except Exception as exc:
            # Nothing half-submitted stays behind: the jobs submitted before this one are cancelled.
            for job in submitted:
                job.slurm.cancel(check=False)
            numbers = ", ".join(f"#{job.idx}" for job in group)
            raise slurm_results.SlurmJobError(f"SLURM refused job(s) {numbers}: {exc}") from None
        for job, slurm_job in zip(group, slurm_jobs, strict=True):
            job.slurm = slurm_job
            submitted.append(job)
            p = job.platform
            log.info(f"#{job.idx} : {job.shown} -> SLURM job {slurm_job.job_id} ({p.n_nodes} node(s) x "
                     f"{p.ranks_per_node} rank(s), partition {p.partition}); output: {job.output_dir}"
                     .replace(" :  -> ", " : -> "))


def _write_manifest(sweep_dir: Path, jobs: List[_Job]) -> Path:
    """Add the submitted jobs to the sweep dir's manifest (a sweep may call the launcher more than once)."""
    path = sweep_dir.absolute() / MANIFEST
    entries = json.loads(path.read_text())["jobs"] if path.exists() else []
    entries += [
        {
            "job": job.idx,
            "overrides": job.overrides,
            "slurm_job_id": job.slurm.job_id,
            "output_dir": str(job.output_dir),
            "node_logs": str(job.slurm.paths.folder),
        }
        for job in jobs
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": entries}, indent=2) + "\n")
    return path


def _wait(jobs: List[_Job]) -> None:
    """Wait until every job has ended: all its nodes sent their outcome of the same run, or sacct says
    it ended (cancelled, timed out, failed, ...). Result files are checked often, sacct less and less."""
    watcher = jobs[0].slurm.watcher
    pending = list(jobs)
    start = time.monotonic()
    next_sacct = start
    while True:
        now = time.monotonic()
        if now >= next_sacct:
            watcher.update()
            next_sacct = now + min(_SACCT_MAX_S, max(_SACCT_MIN_S, (now - start) / 10))
        for job in [job for job in pending if _ended(job, watcher)]:
            pending.remove(job)
            log.info(f"#{job.idx} : SLURM job {job.slurm.job_id} ended ({job.state or 'every node returned'})")
        if not pending:
            return
        time.sleep(_POLL_S)


def _ended(job: _Job, watcher: Any) -> bool:
    state = watcher.get_state(job.slurm.job_id, mode="cache")
    ended = state.split()[0] not in slurm_results.INCOMPLETE_STATES
    tasks = [job.slurm.task(node) for node in range(job.platform.n_nodes)]
    if not ended and not all(task.paths.result_pickle.exists() for task in tasks):
        return False
    outcomes, errors = _read_results(tasks)
    if not ended and (errors or len(slurm_results.latest(outcomes)) < len(tasks)):
        return False  # a result left by an earlier run of a requeued job; wait for this run's
    job.state = state if ended else ""  # every node returned; SLURM may not have recorded the end yet
    job.outcomes, job.node_errors = slurm_results.latest(outcomes), errors
    return True


def _read_results(tasks: List[Any]) -> Tuple[Dict[int, slurm_results.NodeOutcome], Dict[int, str]]:
    """The outcome of every node that sent one, and the error text of every node controller that raised."""
    outcomes: Dict[int, slurm_results.NodeOutcome] = {}
    errors: Dict[int, str] = {}
    for node, task in enumerate(tasks):
        if not task.paths.result_pickle.exists():
            continue
        try:
            outcomes[node] = task.result()
        except Exception as exc:  # noqa: BLE001 - submitit's FailedJobError carries the controller's traceback
            errors[node] = str(exc)
    return outcomes, errors


def _collect(job: _Job) -> JobReturn:
    node0 = job.outcomes.get(0)
    ret = node0.job_return if node0 is not None else None
    ret = ret if ret is not None else _return(job, JobStatus.FAILED, None)
    restarts = max([o.attempt for o in job.outcomes.values()], default=0)
    ended = slurm_results.state_error(job.slurm.job_id, job.state, str(job.slurm.paths.folder), restarts)
    if not job.outcomes and not job.node_errors and not job.state.startswith(("CANCELLED", "TIMEOUT")):
        ended = slurm_results.SlurmJobError(f"{ended}{_stderr_tail(job)}")
    return slurm_results.job_return(ret, job.platform.n_nodes, job.state, job.outcomes, job.node_errors, ended)


def _stderr_tail(job: _Job) -> str:
    """The last lines of node 0's stderr (where a controller that could not start says why)."""
    try:
        lines = job.slurm.task(0).paths.stderr.read_text(errors="backslashreplace").splitlines()
    except OSError:
        return ""
    if not lines:
        return ""
    return "\nlast lines of node 0's stderr:\n" + "\n".join(lines[-_LOG_TAIL_LINES:])


def _return(job: _Job, status: JobStatus, value: Any) -> JobReturn:
    """A JobReturn made here, for a job whose node 0 sent none (dry run, fire and forget, no result)."""
    task_cfg = OmegaConf.masked_copy(job.config, [str(k) for k in job.config if k != "hydra"])
    return JobReturn(
        overrides=job.overrides,
        cfg=task_cfg,
        hydra_cfg=OmegaConf.create({"hydra": job.config.hydra}),
        working_dir=str(job.output_dir),
        task_name=str(job.config.hydra.job.name),
        status=status,
        _return_value=value,
    )
