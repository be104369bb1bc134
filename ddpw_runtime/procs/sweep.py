"""The local launcher's jobs: one Hydra job = one distributed job on this machine, each in a job process of its own
(`procs/job.py`; docs/architecture.md, "Jobs side by side"). A failed job does not stop the others unless `fail_fast`:
then the jobs beside it are stopped (SIGTERM, the interrupt grace), no more start, and its error is raised. An error
outside a task (a callback's) stops new jobs and is raised once the running ones ended; Ctrl-C/SIGTERM exit 130/143."""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from ddpw_conf import ConfigError
from ddpw_conf.errors import CompactError
from ddpw_conf.launcher import LocalLauncherConf
from ddpw_runtime import _compat
from ddpw_runtime.errors import Interrupted, NodeError, NodeLost, Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob, command_line
from ddpw_runtime.hydra_jobs.summary import one_line
from ddpw_runtime.hydra_jobs.sweep_summary import SweepSummary, entry, fail_fast_line
from ddpw_runtime.hydra_jobs.task import DdpwJobReturn, raise_job_error
from ddpw_runtime.launch import pickling, signals
from ddpw_runtime.launch.bounds import KILL_WAIT_S
from ddpw_runtime.launch.children import Child, Children, StarterGone, wait_gone
from ddpw_runtime.launch.devices import Devices, Need, Share, cpu_cores, visible_gpus
from ddpw_runtime.launch.engine import describe, gpus_available
from ddpw_runtime.launch.job import Grace, NodeJob, starter_for
from ddpw_runtime.launch.outcome import signal_name
from ddpw_runtime.launch.payload import read_pickled, write_private
from ddpw_runtime.launch.plan import free_port
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.nodes.environment import place_node
from ddpw_runtime.nodes.sweep_channel import SweepChannel, hosted, stop_job_at
from ddpw_runtime.procs.job import RESULT, JobEnd, JobPayload, run_job_process
from ddpw_runtime.rank.own_process import end_frozen

log = logging.getLogger(__name__)


class JobProcessGone(CompactError, RuntimeError):
    """A job process ended before it wrote how its job ended (killed, as by the OOM killer, or `os._exit` in a
    callback): its ranks end with it (the rank starter stops what it started)."""

    @staticmethod
    def of(idx: int, pid: int, code: int | None) -> JobProcessGone:
        how = f"was killed by {signal_name(-code)}" if code is not None and code < 0 else f"exited with code {code}"
        return JobProcessGone(f"the process of job #{idx} (pid {pid}) {how} before it said how its job ended (the OOM "
                              "killer or a kill may have ended it); the ranks it started were stopped with it")


def run_jobs(hydra_context: HydraContext, task_function: TaskFunction, jobs: Sequence[PreparedJob],
             options: LocalLauncherConf, summary: SweepSummary) -> list[JobReturn]:
    """Run each prepared job as a distributed job in a job process of its own, side by side when their devices fit
    (`max_parallel_jobs`), else one after another; a JobReturn per job, in order, its entry to `summary` as it ends."""
    for job in jobs:  # before any job starts (a node other than 0 never gets here: it follows, `procs/node.py`)
        with options.naming_platform_keys():
            job.platform = place_node(job.platform)
    node_counts = sorted({job.platform.n_nodes for job in jobs})
    if len(node_counts) > 1 and node_counts[-1] > 1:
        raise ConfigError("platform.n_nodes", ",".join(map(str, node_counts)), "every job of a multirun across "
                          "machines runs on the same machines: sweep over other keys, or run a multirun per node count")
    if options.dry_run:
        return [_dry_run(job) for job in jobs]
    # The program's end skips the interpreter's last garbage collections (a plain run's rank 0 does, its heap frozen
    # at the fork): registered once, however many sweeps the program runs.
    atexit.unregister(end_frozen)
    atexit.register(end_frozen)
    return _Sweep(hydra_context, task_function, jobs, options, summary).run()


def side_by_side_devices(jobs: Sequence[PreparedJob], options: LocalLauncherConf) -> Devices | None:
    """The devices jobs share side by side; None when they run one after another (one job, `max_parallel_jobs=1`, or
    jobs that each take the whole machine)."""
    needs = [Need.of(job.platform) for job in jobs]
    if len(jobs) < 2 or options.max_parallel_jobs == 1 or all(need.whole for need in needs):
        return None
    gpu_jobs = [job.platform for job in jobs if job.platform.uses_gpus]
    gpus = visible_gpus(gpus_available(gpu_jobs[0]) or 0) if gpu_jobs else ()
    return Devices(gpus, cpu_cores())


def _note_shared_ports(jobs: Sequence[PreparedJob]) -> None:
    """Say which jobs run one after another because they set the same fixed port (`Devices.take` gives it to one)."""
    sharing: dict[int, list[int]] = {}
    for job in jobs:
        need = Need.of(job.platform)
        if need.port is not None and not need.whole:
            sharing.setdefault(need.port, []).append(job.idx)
    for port, idxs in sharing.items():
        if len(idxs) > 1:
            log.info(f"jobs {', '.join(f'#{idx}' for idx in idxs)} set the same platform.master_port={port}: they "
                     "run one after another (leave master_port unset (null) for a free port per job)")


def _dry_run(job: PreparedJob) -> JobReturn:
    log.info(f"#{job.idx} : {job.shown}")
    # across machines, master_port is the sweep's store: each job's is a free port node 0 chooses (`_Sweep._start`)
    platform = job.platform if job.platform.n_nodes == 1 else replace(job.platform, master_port=None)
    print(f"--- job #{job.idx}: {job.shown or '(no overrides)'} (dry run, nothing started)\n"
          f"{describe(platform, job.output_dir, job.config.hydra.job.env_set)}")
    return DdpwJobReturn(overrides=job.overrides, cfg=job.config, status=JobStatus.COMPLETED)


def start_starter_early(config: DictConfig, options: LocalLauncherConf) -> None:
    """Start the sweep platform's rank starter now, so it imports torch while Hydra composes the jobs (nothing when
    the platform is unreadable: the checks report that before any job starts)."""
    if not options.dry_run:
        with contextlib.suppress(ConfigError):
            starter_for(options.platform_of(config))


class Schedule:
    """Which job starts next: the first waiting one, once its devices (and fixed port) are free and fewer than
    `max_jobs` (None: any number) run. `devices` None: one job at a time, each with the whole machine."""

    def __init__(self, pending: list[PreparedJob], devices: Devices | None, max_jobs: int | None) -> None:
        self.pending = pending
        self.devices = devices
        self.max_jobs = max_jobs
        self.running = 0

    def next(self) -> tuple[PreparedJob, Share | None] | None:
        """The job to start now and its devices (taken from `pending`), or None."""
        if not self.pending or (self.max_jobs is not None and self.running >= self.max_jobs):
            return None
        share = self.devices.take(Need.of(self.pending[0].platform)) if self.devices is not None else None
        if self.devices is not None and share is None:
            return None
        self.running += 1
        return self.pending.pop(0), share

    def ended(self, share: Share | None) -> None:
        """A job that had `share` ended."""
        self.running -= 1
        if self.devices is not None and share is not None:
            self.devices.give_back(share)


@dataclass
class _Running:
    """A job whose job process runs."""

    job: PreparedJob
    share: Share | None
    folder: Path
    started: float


class _Sweep:
    """One launch's jobs, started and waited for (see the module docstring)."""

    def __init__(self, hydra_context: HydraContext, task_function: TaskFunction, jobs: Sequence[PreparedJob],
                 options: LocalLauncherConf, summary: SweepSummary) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.jobs = list(jobs)
        self.options = options
        self.summary = summary
        self.running: dict[int, _Running] = {}
        self.ended: dict[int, JobEnd] = {}
        self.stopped_by = 0
        """The signal (Ctrl-C, SIGTERM) that stops the job processes still running (0: none)."""
        self.failed: JobReturn | None = None
        """With `fail_fast`: the JobReturn of the job that failed first, which stops the sweep."""
        self.children = Children(on_exit=self._ended)
        """The job processes, by pid (the running ones' jobs in `running`)."""
        self.across: SweepChannel | None = None
        """Node 0's side of a multirun across machines: its jobs run one after another, each on every node."""
        self.lost: str | None = None
        """Across machines: which job lost a node (or never had it join), after which no more jobs start."""
        self.silent_seen = False
        """Across machines: a node that followed the sweep fell silent (the job that ran was stopped for it)."""
        if jobs[0].platform.n_nodes > 1:
            starter_for(jobs[0].platform)  # first: a starter forked later would hold the sweep's store open
            self.across = hosted(jobs[0].platform, command_line(jobs[0].config.hydra, summary.sweep.overrides))
        devices = side_by_side_devices(jobs, options) if self.across is None else None
        if devices is not None:
            _note_shared_ports(jobs)
        self.schedule = Schedule(list(jobs), devices, options.max_parallel_jobs if devices is not None else 1)

    def run(self) -> list[JobReturn]:
        """Run every job; their returns in order."""
        try:
            with signals.jobs_running(), signals.passing_on(self._pass_on):
                while self.schedule.pending or self.running:
                    signals.raise_dropped()
                    self._start_what_fits()
                    if not self.running:
                        break
                    while self.children.next_exit(None) is None:  # until a job ends (`_ended` notes how)
                        signals.raise_dropped()
                        self._stop_for_a_silent_node()
        except (KeyboardInterrupt, Terminated) as stop:
            self._stop_all(signals.signal_of(stop))
        except StarterGone as gone:
            self._starter_gone(gone)
        errors = [end.error for _, end in sorted(self.ended.items()) if end.error is not None]
        if errors:
            self._record_not_started()
            raise errors[0]
        if self.failed is not None:
            self._record_not_started()
            raise_job_error(self.failed)
        return [self.ended[job.idx].job_return for job in self.jobs]

    def _pass_on(self, signum: int) -> bool:
        """SIGUSR1 or SIGUSR2 given to the program: to every running job process, which passes it on to its ranks
        (`procs/job.py`), as SIGTERM goes; whether any job runs."""
        running = self.children.running()
        for child in running:
            self.children.signal(child, signum, group=False)
        return bool(running)

    def _start_what_fits(self) -> None:
        """Start waiting jobs in order while their devices are free (none after an error outside a task, nor after a
        failed job with `fail_fast`)."""
        while self.failed is None and not any(end.error is not None for end in self.ended.values()):
            ready = self.schedule.next()
            if ready is None:
                return
            self._start(*ready)

    def _start(self, job: PreparedJob, share: Share | None) -> None:
        if self.across is not None:  # the job's own store, on a port of its own, for the other nodes to follow
            why = self.across.stopped()
            if why is not None or self.lost is not None:
                self._record_not_started()
                raise NodeError(f"{why}; no more jobs start" if why is not None else self.lost)
            job.platform = replace(job.platform, master_port=free_port(str(job.platform.master_addr)))
            self.across.publish_job(self.across.started(), int(job.platform.master_port or 0))
        grace = Grace(self.options.stop_grace_s, self.options.interrupt_grace_s)
        node_job = NodeJob(job.platform, job.output_dir, grace, max_restarts=self.options.max_restarts, share=share,
                           leads_nodes=self.across is not None, second_signal_kills=False,
                           console_prefix=f"[job {job.idx}] " if self.schedule.devices is not None else "")
        job.pin()  # its output dir and ${now:...} as of its start, as Hydra's basic launcher resolves them
        self.summary.record(entry(job.idx, job.overrides, job.output_dir, 0.0, None, "RUNNING"))
        payload = JobPayload(ProcessState.capture(), pickling.dumps((self.hydra_context, self.task_function,
                                                                        job.config)), job.idx, node_job,
                             first=not self.ended and not self.running)
        log.info(f"#{job.idx} : {job.shown}")
        # Ctrl-C or SIGTERM comes once the job is known here (so that it is stopped too), or before its private
        # folder exists (so that none is left behind).
        with signals.held():
            folder = Path(tempfile.mkdtemp(prefix="ddpw-job-"))
            try:
                write_private(folder / "payload.pkl", payload)
                pid = starter_for(job.platform).start_job(self.children.inbox, str(folder / "payload.pkl"),
                                                          run_job_process)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self.running[pid] = _Running(job, share, folder, time.monotonic())
            self.children.add(pid, f"the process of job #{job.idx}")

    def _ended(self, child: Child) -> None:
        """Job process `child` ended: note how its job ended (with `fail_fast`, a failure stops the others)."""
        with signals.held():  # its private folder is either known here or gone
            running = self.running.pop(child.pid)
            end = read_pickled(running.folder / RESULT, JobEnd) or (
                JobEnd(stopped_by=self.stopped_by) if self.stopped_by else
                JobEnd(error=JobProcessGone.of(running.job.idx, child.pid, child.exit_code)))
            shutil.rmtree(running.folder, ignore_errors=True)
        self.schedule.ended(running.share)
        self.ended[running.job.idx] = end
        job, duration = running.job, time.monotonic() - running.started
        if end.error is not None:  # an error outside the task (a callback's): the job failed, and the sweep stops
            failed = entry(job.idx, job.overrides, job.output_dir, duration, None, "FAILED")
            self.summary.record(replace(failed, error=f"outside its task: {one_line(end.error)}"))
        else:
            stopped = {int(signal.SIGINT): "INTERRUPTED", int(signal.SIGTERM): "TERMINATED"}.get(end.stopped_by or 0)
            if stopped and self.failed is not None:
                stopped = "STOPPED"
            noted = entry(job.idx, job.overrides, job.output_dir, duration, end.job_return, stopped)
            self.summary.record(replace(noted, restarts=end.restarts) if stopped else noted, end.job_return)
            if end.job_return is not None and isinstance(lost := _compat.job_error(end.job_return), NodeLost):
                self.lost = f"no more jobs start, since each would wait for a node that job #{job.idx} lost: {lost}"
                if self.across is not None:  # the sweep's end waits for none of those nodes to read it
                    for node in lost.nodes:
                        self.across.leave(node)
            if self.options.fail_fast and self.failed is None and end.job_return is not None and \
                    end.job_return.status is JobStatus.FAILED:
                self._fail_fast(job, end.job_return)

    def _stop_for_a_silent_node(self) -> None:
        """Across machines: once a following node falls silent (killed, its machine lost, also between jobs), stop the
        running job, which would otherwise wait its whole join timeout for it: it ends naming the node as lost, and no
        more jobs start."""
        if self.across is None or self.silent_seen:
            return
        silent = self.across.silent()
        if silent:
            self.silent_seen = True
            for running in self.running.values():
                stop_job_at(self.across, int(running.job.platform.master_port or 0), self.across.lost_stop(silent[0]))

    def _fail_fast(self, job: PreparedJob, ret: JobReturn) -> None:
        """Job `job` failed (`ret`) with `fail_fast`: stop the jobs running beside it, start no more."""
        self.failed = ret
        beside = sorted(running.job.idx for running in self.running.values())
        waiting = [pending.idx for pending in self.schedule.pending]
        sys.stderr.write(fail_fast_line(job.idx, beside, waiting) + "\n")
        self.children.send(signal.SIGTERM, group=False)

    def _starter_gone(self, gone: StarterGone) -> NoReturn:
        """The rank starter died, and every rank with it: each running job FAILED with `gone`, no more start. Its job
        processes (no longer children here) got SIGTERM and stop what their ranks started: the sweep ends once they
        have, or `interrupt_grace_s` + `KILL_WAIT_S` passed."""
        now = time.monotonic()
        for running in self.running.values():
            job = running.job
            self.summary.record(replace(entry(job.idx, job.overrides, job.output_dir, now - running.started, None,
                                              "FAILED"), error=str(gone)))
            self.ended[job.idx] = JobEnd(error=gone)
        self._record_not_started()
        wait_gone(list(self.running), now + self.options.interrupt_grace_s + KILL_WAIT_S)
        for running in self.running.values():
            shutil.rmtree(running.folder, ignore_errors=True)
        raise gone

    def _record_not_started(self) -> None:
        """An entry for each job that never started."""
        for job in [job for job in self.jobs if job.idx not in self.ended]:
            self.summary.record(entry(job.idx, job.overrides, job.output_dir, 0.0, None, "NOT STARTED"))

    def _stop_all(self, signum: int) -> None:
        """Ctrl-C or SIGTERM: pass it on to every running job, wait until each ended (a line per job), raise what ends
        the program. A job process not ended `interrupt_grace_s` + `KILL_WAIT_S` later (held by a user's callback that
        blocks with signals blocked, say) is killed (`Children.stop`); a second Ctrl-C or SIGTERM kills every job
        process at once, wherever it lands, raising nothing, so each job's end is still noted (its ranks killed at once)
        and the summary right.
        The rank starter kills what a killed job process started; it counts as stopped by `signum`."""
        self.stopped_by = signum
        killed: set[int] = set()  # the jobs still running as the signal came again

        def kill() -> None:
            killed.update(running.job.idx for running in self.running.values())
            self.children.send(signal.SIGKILL, group=False)

        with signals.further(kill):
            if self.running:
                sys.stderr.write(signals.stopping_line(signum, sorted(r.job.idx for r in self.running.values())))
                sys.stderr.flush()
            self.children.stop(signum, self.options.interrupt_grace_s + KILL_WAIT_S, group=False)
            lines = [signals.stopped_line(idx, end.stopped_by, again=idx in killed)
                     for idx, end in sorted(self.ended.items()) if end.stopped_by]
            sys.stderr.write("".join(lines) or signals.nothing_running(signum))  # (it may come as a job is started)
            self._record_not_started()
        raise Terminated() if signum == signal.SIGTERM else Interrupted()

