"""A Ctrl-C or SIGTERM passed on to jobs that run in threads of their own (jobs side by side): Python
raises it in the main thread only, which passes it on here to every job's ranks."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ddpw_runtime.errors import Terminated
from ddpw_runtime.launch.supervisor import NodeRanks


def stopping_error(signum: int) -> BaseException:
    """What a job stopped by `signum` raises: KeyboardInterrupt for Ctrl-C, else `Terminated`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


class Interruption:
    """The signal, once one came, and the ranks of the jobs running now, which it reaches."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._lock = threading.Lock()
        self._ranks: list[NodeRanks] = []

    def fire(self, signum: int) -> None:
        """`signum` came: pass it on to every job running now (the ranks get the interrupt grace; a
        second time, they are killed at once); jobs that start after it do not start."""
        with self._lock:
            self.signum = signum
            for ranks in self._ranks:
                ranks.request_interrupt(signum)

    @contextmanager
    def watching(self, ranks: NodeRanks) -> Iterator[None]:
        """While `ranks` run: a signal reaches them. Raises the signal's error at once if it came
        before they started."""
        with self._lock:
            if self.signum is not None:
                raise stopping_error(self.signum)
            self._ranks.append(ranks)
        try:
            yield
        finally:
            with self._lock:
                self._ranks.remove(ranks)
