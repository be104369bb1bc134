"""A set of child processes: how a supervising process watches and stops its children (a node's ranks, a sweep's job
processes, a plain run's rank 0, the rank starter). Each exit arrives in one `Inbox`: from the rank starter, which reaps
what it starts, or from the child's pidfd (`adopt`: never a channel its forks may hold open). Every stop is one bounded
sequence: a signal, a grace, SIGKILL, `KILL_WAIT_S`, then what is still there is named and left behind."""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum

from ddpw_conf.errors import CompactError
from ddpw_runtime.errors import Terminated
from ddpw_runtime.launch.bounds import KILL_WAIT_S, WAIT_SLICE_S
from ddpw_runtime.launch.protocol import RankExited
from ddpw_runtime.launch.signals import send_to_group

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a thread waiting on its children's pidfds looks at what other threads put in its inbox


class StarterGone(CompactError, RuntimeError):
    """The rank starter died (every rank it started died with it)."""

    @staticmethod
    def of(pid: int) -> StarterGone:
        """The error for the rank starter `pid`."""
        return StarterGone(f"the rank starter (pid {pid}), the process that starts the ranks, died (the OOM killer "
                           "or a kill may have ended it); the ranks it started ended with it")


class Inbox:
    """What a supervising thread waits on, in one queue: its children's exits and wake-ups from other threads."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[RankExited | StarterGone | None] = queue.SimpleQueue()
        self._gone: StarterGone | None = None
        self._watched: dict[int, int] = {}  # pidfd -> pid of each child the waiting thread watches itself

    def watch(self, pid: int) -> None:
        """Take child `pid`'s end from its pidfd in the waiting thread (none can start as 3.12+ exits: `close`)."""
        try:
            self._watched[os.pidfd_open(pid)] = pid
        except ProcessLookupError:  # (reaped already: its code is gone)
            self.put(RankExited(pid, -signal.SIGKILL))

    def forget(self, pid: int) -> None:
        """Stop watching `pid` (left behind)."""
        for fd in [fd for fd, watched in self._watched.items() if watched == pid]:
            del self._watched[fd]
            os.close(fd)

    def put(self, item: RankExited | StarterGone) -> None:
        """Add `item`, waking the waiting thread; a dead starter is kept apart too (no interruption can lose it)."""
        if isinstance(item, StarterGone):
            self._gone = item
        self._items.put(item)

    def wake(self) -> None:
        """Wake the waiting thread (callable from any thread)."""
        self._items.put(None)

    def next(self, timeout: float | None) -> RankExited | None:
        """The next exit; None after `timeout`, a wake-up or `WAIT_SLICE_S`; StarterGone after its last exits."""
        slice_s = WAIT_SLICE_S if timeout is None else min(timeout, WAIT_SLICE_S)
        try:
            if self._gone is not None:
                item = self._items.get_nowait()
            elif self._watched:
                item = self._watched_exit(slice_s)
            else:
                item = self._items.get(timeout=slice_s)
        except queue.Empty:
            item = self._gone
        if isinstance(item, StarterGone):
            raise item
        return item

    def _watched_exit(self, timeout: float) -> RankExited | StarterGone | None:
        """What was put here, else a watched child's end within `timeout` s (else `queue.Empty`), polling the queue."""
        end = time.monotonic() + timeout
        while self._items.empty():
            ready = select.select(list(self._watched), [], [], max(0.0, min(_POLL_S, end - time.monotonic())))[0]
            if ready:
                pid = self._watched.pop(ready[0])
                return RankExited(pid, _reaped(ready[0]))
            if time.monotonic() >= end:
                raise queue.Empty
        return self._items.get_nowait()


class ChildState(Enum):
    """Where a child stands (one alive whose `Child.stopped` is set is stopping)."""

    STARTING = "starting"
    """Not at work yet (a rank that has not left its `RankPayload.task_mark`)."""
    RUNNING = "running"
    ENDED = "ended"
    LEFT_BEHIND = "left behind"
    """Still there `KILL_WAIT_S` after SIGKILL (stuck in the kernel); no longer waited for."""


@dataclass
class Child:
    """One child: its pid, its `name` on the console, where it stands, how it ended."""

    pid: int
    name: str
    state: ChildState = ChildState.RUNNING
    stopped_at: float | None = None
    """When (`time.time`) the first signal of this process's reached it, while it ran."""
    exit_code: int | None = None
    """As in `subprocess`: negative for a signal."""
    ended_at: float | None = None

    @property
    def stopped(self) -> bool:
        """A signal of this process's reached it while it ran."""
        return self.stopped_at is not None

    @property
    def alive(self) -> bool:
        """Still waited for: not ended and not left behind."""
        return self.state in (ChildState.STARTING, ChildState.RUNNING)


class Children:
    """The children of one supervising thread, by pid (`of_pid`); `on_exit` is called with each as its end is noted."""

    def __init__(self, on_exit: Callable[[Child], None] = lambda child: None) -> None:
        self.inbox = Inbox()
        self.of_pid: dict[int, Child] = {}
        self.on_exit = on_exit

    def add(self, pid: int, name: str, state: ChildState = ChildState.RUNNING) -> Child:
        """Count `pid`, whose exit the rank starter reports to `inbox`, as a child."""
        child = self.of_pid[pid] = Child(pid, name, state)
        return child

    def adopt(self, pid: int, name: str) -> Child:
        """Count `pid`, a child of this process, as one, watched by its pidfd (`Inbox.watch`)."""
        child = self.add(pid, name)
        self.inbox.watch(pid)
        return child

    def running(self, spare: int | None = None) -> list[Child]:
        """The children still alive, but the one of pid `spare`."""
        return [child for child in self.of_pid.values() if child.alive and child.pid != spare]

    def next_exit(self, timeout: float | None) -> Child | None:
        """Wait at most `timeout` (`Inbox.next`) for a child's end and note it; that child, or None."""
        event = self.inbox.next(timeout)
        if event is None or (child := self.of_pid.get(event.pid)) is None or not child.alive:
            return None
        child.state, child.exit_code, child.ended_at = ChildState.ENDED, event.exit_code, time.time()
        self.on_exit(child)
        return child

    def wait(self, deadline: float, spare: int | None = None, until: Callable[[], bool] = lambda: False) -> bool:
        """Note ends until all but `spare` ended, `deadline` (monotonic) or `until()`; whether they all ended."""
        while self.running(spare) and not until():
            if self.next_exit(max(0.0, deadline - time.monotonic())) is None and time.monotonic() >= deadline:
                break
        return not self.running(spare)

    def send(self, sig: int, to: list[Child] | None = None, group: bool = True) -> None:
        """Send `sig` to every child alive (or those `to`; with `group`, to its process group); each is stopped."""
        for child in self.running() if to is None else to:
            child.stopped_at = child.stopped_at or time.time()
            self.signal(child, sig, group)

    def signal(self, child: Child, sig: int, group: bool) -> None:
        """How `sig` reaches `child` (`send`)."""
        send_to_group(child.pid, sig, group)

    def stop(self, sig: int, grace_s: float, group: bool = True) -> list[Child]:
        """`sig` to all, `grace_s` (a Ctrl-C or SIGTERM cuts it short), then `kill`; those left behind."""
        self.send(sig, self.running(), group)
        with suppress(KeyboardInterrupt, Terminated):
            self.wait(time.monotonic() + grace_s)
        return self.kill(group=group)

    def kill(self, spare: int | None = None, group: bool = True) -> list[Child]:
        """SIGKILL all but `spare`, wait `KILL_WAIT_S` at most; those still there are logged, left behind, returned."""
        self.send(signal.SIGKILL, self.running(spare), group)
        self.wait(time.monotonic() + KILL_WAIT_S, spare)
        left = self.running(spare)
        for child in left:
            child.state = ChildState.LEFT_BEHIND
            self.inbox.forget(child.pid)
            log.error("%s (pid %d) did not exit %.0f s after SIGKILL (stuck in the kernel, such as a hung GPU call); "
                      "left behind", child.name, child.pid, KILL_WAIT_S)
        return left


def wait_gone(pids: list[int], deadline: float) -> None:
    """Wait (by pidfds) until the processes `pids`, children or not, have ended, or `deadline` (monotonic) passed."""
    fds = []
    for pid in pids:
        with suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            for fd in select.select(fds, [], [], left)[0]:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def wait_for_exit(pid: int) -> int:
    """Wait for child `pid` to end (by its pidfd: not a channel its forks may hold open), reap it; its exit code
    (-SIGKILL for one already reaped: its code is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return -signal.SIGKILL
    select.select([fd], [], [])
    return _reaped(fd)


def _reaped(pidfd: int) -> int:
    """Reap the ended child of `pidfd` and close it; its exit code (-SIGKILL when reaped elsewhere meanwhile)."""
    try:
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:
        return -signal.SIGKILL
    finally:
        os.close(pidfd)
    assert status is not None
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
