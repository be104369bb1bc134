"""The task Hydra's `run_job` calls in a controller (local launcher and every SLURM node): the user's task on every
rank of this node, rank 0's value as the job's; and the JobReturn that carries every rank's value."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.types import TaskFunction
from omegaconf import DictConfig

from ddpw_runtime.hydra_jobs.summary import JobConsole
from ddpw_runtime.launch.engine import run_ranks
from ddpw_runtime.launch.job import NodeJob
from ddpw_runtime.launch.payload import TaskCall


@dataclass
class DdpwJobReturn(JobReturn):
    """Hydra's JobReturn of a distributed job: `return_value` is rank 0's value, `rank_values` every rank's."""

    rank_values: list[Any] = field(default_factory=list)
    restarts: int = 0
    """How often the job started again (`hydra.launcher.max_restarts`; on SLURM, requeued) before it ended."""

    @staticmethod
    def of(ret: JobReturn, rank_values: list[Any], restarts: int) -> DdpwJobReturn:
        """`ret` with `rank_values` and `restarts`."""
        return DdpwJobReturn(**{f.name: getattr(ret, f.name) for f in fields(JobReturn)}, rank_values=rank_values,
                             restarts=restarts)


def raise_job_error(ret: JobReturn) -> NoReturn:
    """Fail the sweep with a FAILED JobReturn's error, as Hydra's sweepers do (reading `return_value` raises it)."""
    raise ret.return_value  # reading it raises; for a FAILED JobReturn nothing is ever returned


def append_to_job_files() -> None:
    """Make this process's logging file handlers append from now on (a `mode: w` job log was emptied as the job
    began): rank 0, a process of its own, writes to the same files meanwhile, and neither may overwrite the other."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for handler in {id(h): h for lg in loggers for h in lg.handlers}.values():
        if isinstance(handler, logging.FileHandler) and handler.mode == "w":
            handler.close()
            handler.mode = "a"  # reopened, appending, at its next record


class JobTask:
    """What `run_job` calls: runs the user's task on every rank of this node (`job`, in the job's output dir) and
    returns rank 0's value (every rank's in `values`, how often it started again in `restarts`); it carries the user's
    function's name and `__wrapped__`, so callbacks see the user's task. `announce`: print the job's start line and
    summary; `around_ranks`: a context entered while the ranks run (the SLURM node's preemption handling)."""

    def __init__(self, task_function: TaskFunction, job: NodeJob, idx: int, announce: bool = True,
                 around_ranks: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        functools.update_wrapper(self, task_function)
        self.task_function, self.job, self.idx = task_function, job, idx
        self.announce, self.around_ranks = announce, around_ranks
        self.values: list[Any] = []
        self.restarts = 0

    def __call__(self, cfg: DictConfig) -> Any:
        """Run the ranks; rank 0's value."""
        runtime = HydraConfig.get().runtime
        job = replace(self.job, log_dir=Path(runtime.output_dir))
        console = JobConsole(self.idx, job.platform, job.log_dir, Path(runtime.cwd)) if self.announce else None

        def attempt(run: NodeJob) -> None:
            self.restarts = run.restart_count
            if console is not None:
                console.attempt(run)

        with console.shown() if console is not None else nullcontext():
            append_to_job_files()
            with self.around_ranks():
                self.values = run_ranks(TaskCall(self.task_function, (cfg,)), job, attempt)
        return self.values[0]
