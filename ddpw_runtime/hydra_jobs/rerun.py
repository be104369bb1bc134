"""`--experimental-rerun .hydra/config.pickle` of a plain run with a ddpw launcher: the job runs again
as a distributed job, in its output dir.

Hydra's rerun calls the task function directly, without callbacks, so `PlainRun` never hears of it.
`ddpw_conf` calls `install()` when it is imported by a program started with `--experimental-rerun`
(the pickled config imports it, its `platform` node being a typed `Platform`); the rerun then calls the
task through `_distributed`, which does what `PlainRun` does around a plain run's task.
"""

from __future__ import annotations

import functools
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from hydra.types import TaskFunction
from omegaconf import DictConfig

from ddpw_runtime import _compat
from ddpw_runtime.hydra_jobs.plain_run import RankZeroHere, selected_launcher


def install() -> None:
    """Make Hydra's rerun call the task through `_distributed`."""
    _compat.wrap_rerun_task(_distributed)


def _distributed(task_function: TaskFunction) -> TaskFunction:
    @functools.wraps(task_function)
    def rerun(cfg: DictConfig) -> Any:
        setup_globals()  # Hydra's resolvers (`${now:...}`), which its rerun does not register
        if selected_launcher(HydraConfig.get()) is None:
            return task_function(cfg)
        job = RankZeroHere(cfg, task_function)
        ret = JobReturn()
        try:
            ret.return_value = task_function(cfg)
            ret.status = JobStatus.COMPLETED
        except Exception as error:
            ret.return_value = error
            ret.status = JobStatus.FAILED
        job.finish(ret)
        return ret.return_value  # raises the job's error when it failed

    return rerun
