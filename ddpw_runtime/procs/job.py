"""A job process: one Hydra job of a local multirun, forked by the rank starter (`StartJob`; docs/architecture.md,
"Multirun: a job process per job"). It takes on the launching process's state, runs Hydra's `run_job` with a
`JobTask` (which starts and supervises the ranks) and writes how the job ended (`JobEnd`). No task code runs here."""

from __future__ import annotations

import pickle
import signal
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddpw_runtime import _compat
from ddpw_runtime.errors import Terminated
from ddpw_runtime.hydra_jobs.prepare import PreparedJob
from ddpw_runtime.launch import pickling
from ddpw_runtime.launch.job import NodeJob
from ddpw_runtime.launch.payload import write_atomically
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.protocol import Channel
from ddpw_runtime.launch.records import portable
from ddpw_runtime.launch.signals import PASSED_ON, raise_terminated, signal_of
from ddpw_runtime.launch.starter import RankStarter, close_starters, use_starter
from ddpw_runtime.launch.supervisor import pass_on

RESULT = "job.result"
"""The file, next to the job's payload, where the job process writes its `JobEnd`."""


@dataclass
class JobPayload:
    """What a job process needs: the launching process's state, and (pickled, read once that state is entered)
    Hydra's context, the task function and the job's config."""

    state: ProcessState
    hydra_job: bytes
    """`pickling.dumps` of (hydra_context, task_function, config)."""
    idx: int
    node_job: NodeJob
    first: bool
    """Whether it is the first job its launch starts: only that one shows Hydra's `run_job` warnings (the working
    directory's, for apps of `version_base="1.1"`), once per sweep as in Hydra's launcher, which runs every job in one
    process."""


@dataclass
class JobEnd:
    """How a job process's job ended: its JobReturn, the signal that stopped it, or an error outside the task (a
    callback's), which stops the sweep."""

    job_return: Any = None
    stopped_by: int | None = None
    error: BaseException | None = None
    restarts: int = 0
    """How often a stopped job had started again (`hydra.launcher.max_restarts`) before the stop came."""


def run_job_process(payload_path: str, channel: Channel, starter_pid: int, preload: bool) -> int:
    """The job process (see the module docstring); its exit code."""
    from hydra.core.utils import run_job

    from ddpw_runtime.hydra_jobs.task import DdpwJobReturn, JobTask

    signal.signal(signal.SIGTERM, raise_terminated)
    for sig in PASSED_ON:  # the multirun's controller passes them on: to the job's ranks (none before or after them)
        signal.signal(sig, lambda signum, frame: pass_on(signum))
    use_starter(RankStarter(preload, attached_to=(channel, starter_pid)))
    result = Path(payload_path).parent / RESULT
    task: JobTask | None = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held since the fork (see the starter)
        with open(payload_path, "rb") as src:
            payload: JobPayload = pickle.load(src)
        payload.state.enter({})
        if not payload.first:
            warnings.filterwarnings("ignore", category=UserWarning, module=__name__)  # (see `JobPayload.first`)
        hydra_context, task_function, config = pickle.loads(payload.hydra_job)
        task = JobTask(task_function, replace(payload.node_job, scratch=str(result.parent)), payload.idx)
        key, subkey = PreparedJob.dir_keys
        ret = run_job(hydra_context=hydra_context, task_function=task, config=config, job_dir_key=key,
                      job_subdir_key=subkey)
        error = _compat.job_error(ret)
        if error is not None:  # it must reach the launching process, whatever its class
            ret.return_value = portable(error)
        end = JobEnd(job_return=DdpwJobReturn.of(ret, task.values, task.restarts))
    except (KeyboardInterrupt, Terminated) as stop:
        end = JobEnd(stopped_by=signal_of(stop), restarts=task.restarts if task is not None else 0)
    except BaseException as error:  # noqa: BLE001 - the sweep decides what an error outside the task does
        end = JobEnd(error=portable(error))
    finally:
        close_starters()
    write_atomically(result, pickling.dumps(end))
    return 0
