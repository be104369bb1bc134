"""The job description the controller hands to its ranks, through a file only the user can read."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import cloudpickle

from ddpw_runtime.plan import LaunchPlan


@dataclass
class RankPayload:
    """What every rank of a job needs: the plan, the task (cloudpickled) and the caller's process state."""

    plan: LaunchPlan
    task: bytes
    """cloudpickle of (target, args, kwargs); unpickled after the Hydra state is restored."""
    hydra_state: Optional[bytes]
    env: Dict[str, str]
    cwd: str
    sys_path: List[str]
    result_dir: str

    def result_file(self, rank: int) -> Path:
        """Where global rank `rank` writes its `RankResult`."""
        return Path(self.result_dir) / f"rank_{rank}.result"


def pack_task(target: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]) -> bytes:
    """Serialise the task; functions from `__main__` or a notebook travel by value."""
    return cloudpickle.dumps((target, args, kwargs))


def write_payload(payload: RankPayload, path: Path) -> None:
    """Write `payload` to `path` with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)


def read_payload(path: Path) -> RankPayload:
    """Read a payload written by `write_payload`."""
    with open(path, "rb") as src:
        payload: RankPayload = pickle.load(src)
    return payload


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` so that readers see either nothing or all of it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
