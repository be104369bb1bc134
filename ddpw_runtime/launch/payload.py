"""What the controller hands to the ranks of one job (`RankPayload`), through a file only the user can read, and where
the ranks put their results. Data only (no torch): rank processes import it too."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ddpw_runtime.launch import pickling
from ddpw_runtime.launch.plan import LaunchPlan
from ddpw_runtime.launch.process_state import ProcessState


@dataclass
class TaskCall:
    """The function every rank calls, and its arguments."""

    target: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def pack(self) -> bytes:
        """Serialised for every rank (`pickling`); a TypeError naming the part that cannot be (target, or argument)."""
        try:
            return pickling.dumps(self)
        except Exception as error:
            parts = [("target", self.target), *((f"args[{i}]", value) for i, value in enumerate(self.args)),
                     *((f"kwargs[{name!r}]", value) for name, value in self.kwargs.items())]
            for name, value in parts:
                try:
                    pickling.dumps(value)
                except Exception as cause:  # noqa: BLE001 - whatever pickling raised, it is named with its part
                    text = repr(value)
                    short = text if len(text) <= 80 else text[:77] + "..."
                    raise TypeError(f"the task's {name} ({short}) cannot be sent to the ranks "
                                    f"({type(cause).__name__}: {cause}): make it inside the task, or pass what it is "
                                    "made from") from error
            raise

    def __call__(self) -> Any:
        """Call the target."""
        return self.target(*self.args, **self.kwargs)


def from_task(exc: BaseException) -> BaseException:
    """`exc` with the frames above the task (the runtime's `TaskCall`) dropped, so its traceback starts at the task."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is TaskCall.__call__.__code__:
            return exc.with_traceback(tb.tb_next)
        tb = tb.tb_next
    return exc


_T = TypeVar("_T")

JOB_ENV = "DDPW_JOB"
"""The variable that names a rank's job (its private folder) in its and its descendants' environment."""


@dataclass
class RankPayload:
    """What every rank of a job needs: the plan, the task (`TaskCall.pack`) and the launching process's state."""

    plan: LaunchPlan
    task: bytes  # `TaskCall.pack()`; unpickled after the process state (with Hydra's) is entered
    state: ProcessState
    result_dir: str

    def result_file(self, rank: int) -> Path:
        """Where global rank `rank` writes its `RankResult`."""
        return Path(self.result_dir) / f"rank_{rank}.result"

    def task_mark(self, rank: int) -> Path:
        """The file global rank `rank` makes just before it calls its task: until then it is still starting."""
        return Path(self.result_dir) / f"rank_{rank}.in_task"

    def job_environment(self, own_process: bool = False) -> dict[str, str]:
        """The job's variables for every rank: `JOB_ENV`, and its private folder as TMPDIR (short for Unix socket paths,
        gone with the job), but not in the user's `own_process`, whose files there outlive the job."""
        return {JOB_ENV: self.result_dir, **({} if own_process else {"TMPDIR": self.result_dir})}


def write_private(path: Path, obj: object) -> None:
    """Pickle `obj` to a new file `path` that only the user can read."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        pickle.dump(obj, out, protocol=pickle.HIGHEST_PROTOCOL)


def read_pickled(path: Path, kind: type[_T]) -> _T | None:
    """The `kind` pickled at `path` (None: missing, cut short, made by code that is gone, or something else)."""
    try:
        found = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - whatever unpickling raised, there is no such record to read
        return None
    return found if isinstance(found, kind) else None


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` so that readers see either nothing or all of it (a new file gets `mode`); writers in other
    processes may write the same `path` meanwhile (the last one's stays)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as out:
        out.write(data)
    os.replace(tmp, path)
