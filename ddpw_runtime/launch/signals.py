"""Signals: to ranks (each rank leads its own process group, so a signal to the group reaches what the
rank started too), and Ctrl-C and SIGTERM held back in the controller while it must not be interrupted."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def send_to_group(pid: int, sig: int, group: bool = True) -> None:
    """Send `sig` to the process group led by `pid` (with `group`), or to `pid` alone; a process that is
    already gone is not an error."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def held(signals: tuple[int, ...] = STOPPING_SIGNALS) -> Iterator[None]:
    """Run the block whole: `signals` that arrive meanwhile (Ctrl-C, SIGTERM) reach their own handlers
    right after it. Python runs signal handlers in the main thread only, so this holds them there
    whichever thread the kernel delivered them to (a signal mask would hold them only when no other
    thread exists); elsewhere nothing is needed. A handler that was not set from Python is left as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for sig in signals:
        handler = signal.getsignal(sig)
        if handler is not None:
            previous[sig] = signal.signal(sig, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(arrived):
            signal.raise_signal(sig)
