"""Ctrl-C and SIGTERM to a program whose Hydra run or sweep a ddpw launcher is in charge of: exit 130 or
143 at any moment, with a message, and nothing left behind.

From the moment hydra-ddpw takes over (the plain-run callback's `on_run_start`, or the launcher's
`setup` in a multirun), Ctrl-C raises `Interrupted` (a KeyboardInterrupt, so tasks and libraries that
catch one still do; uncaught, the program exits 130 without a traceback) and SIGTERM raises
`Terminated` (exit 143); a second SIGTERM is ignored, as the program is already stopping. While a job
runs, its own handling passes the signal on to the ranks and says which job was stopped; outside a job
(Hydra composing, between jobs) the handler says so itself. Before hydra-ddpw takes over, the program is
any Hydra app, and Ctrl-C ends it as it ends any.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ddpw_runtime.errors import Interrupted, Terminated

_jobs = 0
"""How many jobs are running now (their handling reports an interruption)."""
_jobs_lock = threading.Lock()
_terminating = False


def install() -> None:
    """Handle Ctrl-C and SIGTERM as the module docstring says, from now on (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_interrupt)
        signal.signal(signal.SIGTERM, _on_terminate)


@contextmanager
def job_running() -> Iterator[None]:
    """While a job runs: its own handling reports an interruption."""
    global _jobs
    with _jobs_lock:
        _jobs += 1
    try:
        yield
    finally:
        with _jobs_lock:
            _jobs -= 1


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if not _jobs:
        sys.stderr.write("Interrupted: no rank was running.\n")
    raise Interrupted()


def _on_terminate(signum: int, frame: FrameType | None) -> None:
    global _terminating
    if _terminating:
        return
    _terminating = True
    if not _jobs:
        sys.stderr.write("Terminated (SIGTERM): no rank was running.\n")
    raise Terminated()
