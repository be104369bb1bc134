"""Shared helpers for the tests: run the test app as a user would, and read what its ranks saw."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

APPS = Path(__file__).parent / "apps"


def run_app(cwd: Path, *overrides: str, app: str = "app.py", timeout: float = 120) -> subprocess.CompletedProcess:
    """`python tests/apps/<app> <overrides>` in `cwd`, output captured as text."""
    return subprocess.run(
        [sys.executable, str(APPS / app), *overrides],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter, output captured as text."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def job_dirs(root: Path) -> list[Path]:
    """Every Hydra job output dir (a folder holding `.hydra/`) under `root`, sorted."""
    return sorted(p.parent for p in root.rglob(".hydra"))


def seen(job_dir: Path) -> dict[int, dict]:
    """What each rank of a job reported, by rank. A report still being written (a test polls while the
    ranks run) counts as not made yet."""
    found = {}
    for path in job_dir.glob("seen_rank_*.json"):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        found[data["rank"]] = data
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def leftover(ranks: dict[int, dict]) -> list[int]:
    """Pids of ranks, or of the process that started them, that are still alive."""
    pids = {r["pid"] for r in ranks.values()} | {r["ppid"] for r in ranks.values()}
    return sorted(pid for pid in pids if pid != os.getpid() and alive(pid))


def start_app(cwd: Path, *overrides: str, app: str = "app.py") -> subprocess.Popen:
    """Start the test app without waiting for it; output captured as text."""
    return subprocess.Popen(
        [sys.executable, str(APPS / app), *overrides],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Block until `condition()` holds (checked every 20 ms); fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def open_fds() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def run_ranks(target: Callable[..., Any], *args: Any, platform: Any, log_dir: Path) -> list[Any]:
    """The engine called directly: `target(*args)` on every rank of `platform`; every rank's value."""
    from ddpw_runtime.launch.engine import run_ranks as run
    from ddpw_runtime.launch.job import NodeJob
    from ddpw_runtime.launch.payload import TaskCall

    return run(TaskCall(target, args), NodeJob(platform, log_dir))


@contextlib.contextmanager
def started_with(sig: int, disposition: signal.Handlers) -> Iterator[None]:
    """Programs started in the block begin with `sig` at `disposition` (SIG_DFL: as from a terminal;
    SIG_IGN: as under `nohup` for SIGHUP, or as a script's background command for SIGINT), whatever this
    test run was started with."""
    before = signal.signal(sig, disposition)
    try:
        yield
    finally:
        signal.signal(sig, before)
