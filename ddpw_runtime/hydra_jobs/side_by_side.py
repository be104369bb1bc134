"""Jobs of a sweep side by side on this machine, each on devices of its own.

Hydra's `run_job` sets process-wide state for its job (working dir, environment, `HydraConfig`, the
job's logging). Jobs side by side each run `run_job` in a thread of their own and take `Turns`: a job
holds the process while Hydra sets it up and ends it, and gives it back (the state as it was before any
job) while its ranks run, which is nearly all of a job's time. So every job's `.hydra/`, log file,
callbacks and what the launcher logs for it are what they would be alone.

Jobs start in job order as soon as their devices are free (`launch/devices.py`); results come back in
job order; a failed job does not stop the others; Ctrl-C or SIGTERM stops every running job (only the
main thread gets them: `Interruption` passes them on).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn

from ddpw_runtime.errors import Interrupted, Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob
from ddpw_runtime.hydra_jobs.summary import stopped_line
from ddpw_runtime.launch.devices import Devices, Need, Share
from ddpw_runtime.launch.interruption import Interruption


@dataclass
class _LoggerState:
    handlers: list[logging.Handler]
    level: int
    propagate: bool
    disabled: bool


@dataclass
class _RunJobState:
    """What `run_job` changes in this process for its job."""

    cwd: str
    env: dict[str, str]
    hydra_cfg: Any
    """`HydraConfig`'s config (a DictConfig, or None before Hydra set one)."""
    loggers: dict[str, _LoggerState]

    @staticmethod
    def capture() -> _RunJobState:
        loggers = {"": logging.getLogger()} | {
            name: logger for name, logger in logging.Logger.manager.loggerDict.items()
            if isinstance(logger, logging.Logger)
        }
        states = {name: _LoggerState(list(lg.handlers), lg.level, lg.propagate, lg.disabled)
                  for name, lg in loggers.items()}
        return _RunJobState(os.getcwd(), dict(os.environ), HydraConfig.instance().cfg, states)

    def restore(self) -> None:
        os.chdir(self.cwd)
        if dict(os.environ) != self.env:
            os.environ.clear()
            os.environ.update(self.env)
        HydraConfig.instance().cfg = self.hydra_cfg
        for name, state in self.loggers.items():
            logger = logging.getLogger(name or None)
            logger.handlers[:] = state.handlers
            logger.setLevel(state.level)
            logger.propagate, logger.disabled = state.propagate, state.disabled


class Turns:
    """Whose job holds this process's state now (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base = _RunJobState.capture()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """The whole of one job's `run_job`; the process is put back as it was before any job after it."""
        with self._lock:
            try:
                yield
            finally:
                self._base.restore()

    @contextmanager
    def ranks_running(self) -> Iterator[None]:
        """Inside a `turn`, while the job's ranks run (started and waited for, nothing logged): the
        process goes to other jobs, and back to this one's state afterwards."""
        mine = _RunJobState.capture()
        self._base.restore()
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            mine.restore()


RunOne = Callable[[PreparedJob, Share, Interruption], JobReturn]
"""Runs one job on its share of the devices (in a thread of its own)."""


def run_side_by_side(
    jobs: Sequence[PreparedJob], devices: Devices, max_jobs: int | None, run_one: RunOne,
    on_end: Callable[[PreparedJob, JobReturn | BaseException], None],
) -> list[JobReturn]:
    """Run `jobs`, at most `max_jobs` at a time (None: as many as the devices fit), each as soon as
    its devices are free, in job order; `on_end` is called as each job ends. One JobReturn per job, in
    order. Raises `Interrupted` or `Terminated` after stopping every running job on Ctrl-C or SIGTERM;
    an error outside the task (a callback's, say) stops new jobs from starting and is raised once the
    running ones ended."""
    interruption = Interruption()
    ended: queue.Queue[tuple[PreparedJob, Share, JobReturn | BaseException]] = queue.Queue()
    results: dict[int, JobReturn | BaseException] = {}
    pending = list(jobs)
    running: dict[int, threading.Thread] = {}

    def run(job: PreparedJob, share: Share) -> None:
        try:
            outcome: JobReturn | BaseException = run_one(job, share, interruption)
        except BaseException as exc:  # handed to the main thread, which decides
            outcome = exc
        ended.put((job, share, outcome))

    def collect(job: PreparedJob, share: Share, outcome: JobReturn | BaseException) -> None:
        devices.give_back(share)
        running.pop(job.idx).join()
        results[job.idx] = outcome
        on_end(job, outcome)

    try:
        while pending or running:
            while pending and (max_jobs is None or len(running) < max_jobs) and not _errors(results):
                share = devices.take(Need.of(pending[0].platform))
                if share is None:
                    break
                job = pending.pop(0)
                running[job.idx] = threading.Thread(target=run, args=(job, share), name=f"ddpw job {job.idx}",
                                                    daemon=True)
                running[job.idx].start()
            if not running:
                break
            collect(*_next(ended))
    except (KeyboardInterrupt, Terminated) as stop:
        signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
        interruption.fire(signum)
        _stop_all(interruption, running, ended, collect, signum)
        for idx, outcome in sorted(results.items()):
            if isinstance(outcome, (KeyboardInterrupt, Terminated)):
                sys.stderr.write(stopped_line(idx, signum) + "\n")
        raise (Terminated() if signum == signal.SIGTERM else Interrupted()) from None
    errors = _errors(results)
    if errors:
        raise errors[0]
    return [_as_return(results[job.idx]) for job in jobs]


def _stop_all(
    interruption: Interruption, running: dict[int, threading.Thread],
    ended: queue.Queue[tuple[PreparedJob, Share, JobReturn | BaseException]],
    collect: Callable[[PreparedJob, Share, JobReturn | BaseException], None], signum: int,
) -> None:
    """Wait until every running job stopped; a second Ctrl-C has their ranks killed at once (a second
    SIGTERM is ignored, see `interrupts.py`)."""
    while running:
        try:
            collect(*_next(ended))
        except (KeyboardInterrupt, Terminated):
            interruption.fire(signum)


_SIGNAL_CHECK_S = 0.1
"""How often the main thread, waiting for a job to end, runs the Python handlers of signals the kernel
delivered to another thread (which do not wake a blocked wait)."""


def _next(ended: queue.Queue[tuple[PreparedJob, Share, JobReturn | BaseException]]) -> tuple[
        PreparedJob, Share, JobReturn | BaseException]:
    while True:
        try:
            return ended.get(timeout=_SIGNAL_CHECK_S)
        except queue.Empty:
            pass


def _errors(results: dict[int, JobReturn | BaseException]) -> list[BaseException]:
    return [outcome for _, outcome in sorted(results.items()) if isinstance(outcome, BaseException)]


def _as_return(outcome: JobReturn | BaseException) -> JobReturn:
    assert isinstance(outcome, JobReturn)
    return outcome
