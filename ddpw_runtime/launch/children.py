"""A set of child processes: the one way a supervising process watches and stops its children (a node's ranks, a
sweep's job processes, rank 0 of a plain run, the rank starter). Each exit arrives in one `Inbox`: from the rank
starter, which reaps what it starts, or from the child's pidfd (`adopt`: never by a channel its forks may hold open).
Every stop is one bounded sequence: a first signal, a grace, SIGKILL, `KILL_WAIT_S`, then what is still there is named
(on the console, and in the job's log where there is one) and left behind."""

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

_POLL_S = 0.05
"""How often a thread that waits on the pidfds of its children looks at what other threads put in its inbox."""


class StarterGone(CompactError, RuntimeError):
    """The rank starter died (every rank it started died with it)."""

    @staticmethod
    def of(pid: int) -> StarterGone:
        """The error for the rank starter of pid `pid`."""
        return StarterGone(f"the rank starter (pid {pid}), the process that starts the ranks, died (the OOM killer "
                           "or a kill may have ended it); the ranks it started ended with it")


class Inbox:
    """What a supervising thread waits on: its children's exits (from the starter's reader thread, or from the pidfds
    of those it watches itself) and wake-ups from other threads, in one queue."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[RankExited | StarterGone | None] = queue.SimpleQueue()
        self._gone: StarterGone | None = None
        self._watched: dict[int, int] = {}
        """The pidfd of each child whose end the waiting thread watches itself (`watch`), and its pid."""

    def watch(self, pid: int) -> None:
        """Take the end of `pid`, a child of this process, from its pidfd (and reap it), in the waiting thread itself:
        no thread of its own, since none can start while Python exits (Python 3.12 and later), where the rank starter
        is closed."""
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
        """Add `item` and wake the waiting thread (from any thread). That the starter died is kept apart too, so an
        interruption landing while `next` takes it (a job process's SIGTERM as its starter dies) cannot lose it."""
        if isinstance(item, StarterGone):
            self._gone = item
        self._items.put(item)

    def wake(self) -> None:
        """Wake the waiting thread (callable from any thread)."""
        self._items.put(None)

    def next(self, timeout: float | None) -> RankExited | None:
        """The next exit; None when `timeout` seconds (None: no limit) pass first, a wake-up comes (the caller looks
        at what it was asked), or `WAIT_SLICE_S` passed. StarterGone once the exits it reported before are taken."""
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
        """What was put here, or else the end of a watched child within `timeout` seconds (`queue.Empty` if none came);
        what other threads put is looked at every `_POLL_S` meanwhile."""
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
    """Where a child stands (one still alive whose `Child.stopped` is set is stopping)."""

    STARTING = "starting"
    """Started, not at work yet (a rank not in its task: it has not left its mark, `RankPayload.task_mark`)."""
    RUNNING = "running"
    ENDED = "ended"
    LEFT_BEHIND = "left behind"
    """It did not vanish `KILL_WAIT_S` after SIGKILL (stuck in the kernel); no longer waited for."""


@dataclass
class Child:
    """One child: its process, what it is (`name`, as the console names it), where it stands, how it ended."""

    pid: int
    name: str
    state: ChildState = ChildState.RUNNING
    stopped: bool = False
    """A signal of this process's reached it while it ran."""
    exit_code: int | None = None
    """As in `subprocess`: negative for a signal."""
    ended_at: float | None = None

    @property
    def alive(self) -> bool:
        """Still waited for: not ended and not left behind."""
        return self.state in (ChildState.STARTING, ChildState.RUNNING)


class Children:
    """The children of one supervising thread, by pid (`of_pid`), as they start, run and end. `on_exit` is called
    with each child as its end is noted (in the supervising thread)."""

    def __init__(self, on_exit: Callable[[Child], None] = lambda child: None) -> None:
        self.inbox = Inbox()
        self.of_pid: dict[int, Child] = {}
        self.on_exit = on_exit

    def add(self, pid: int, name: str, state: ChildState = ChildState.RUNNING) -> Child:
        """Count process `pid`, whose exit will come to `inbox` (the rank starter reports it), as a child."""
        child = self.of_pid[pid] = Child(pid, name, state)
        return child

    def adopt(self, pid: int, name: str) -> Child:
        """Count `pid`, a child of this process, as one; it is watched by its pidfd (and reaped) as the supervising
        thread waits (`Inbox.watch`)."""
        child = self.add(pid, name)
        self.inbox.watch(pid)
        return child

    def running(self, spare: int | None = None) -> list[Child]:
        """The children still alive, but the one of pid `spare`."""
        return [child for child in self.of_pid.values() if child.alive and child.pid != spare]

    def next_exit(self, timeout: float | None) -> Child | None:
        """Wait at most `timeout` seconds (None: `WAIT_SLICE_S`, see `Inbox.next`) for a child's end and note it;
        that child, or None (no end came, a wake-up, or the end of a process that is not a child)."""
        event = self.inbox.next(timeout)
        if event is None or (child := self.of_pid.get(event.pid)) is None or not child.alive:
            return None
        child.state, child.exit_code, child.ended_at = ChildState.ENDED, event.exit_code, time.time()
        self.on_exit(child)
        return child

    def wait(self, deadline: float, spare: int | None = None, until: Callable[[], bool] = lambda: False) -> bool:
        """Note the children's ends until every child but `spare` has ended, `deadline` (monotonic) passed, or
        `until()`; whether they all ended."""
        while self.running(spare) and not until():
            if self.next_exit(max(0.0, deadline - time.monotonic())) is None and time.monotonic() >= deadline:
                break
        return not self.running(spare)

    def send(self, sig: int, to: list[Child] | None = None, group: bool = True) -> None:
        """Send `sig` to every child alive (or those `to`), and with `group` to its process group; each is stopped."""
        for child in self.running() if to is None else to:
            child.stopped = True
            self.signal(child, sig, group)

    def signal(self, child: Child, sig: int, group: bool) -> None:
        """How `sig` reaches `child` (`send`)."""
        send_to_group(child.pid, sig, group)

    def stop(self, sig: int, grace_s: float, spare: int | None = None, group: bool = True) -> list[Child]:
        """Send `sig` to every child but `spare`, give them `grace_s` to end (a Ctrl-C or SIGTERM meanwhile cuts it
        short), then `kill` what is left; the children left behind."""
        self.send(sig, self.running(spare), group)
        with suppress(KeyboardInterrupt, Terminated):
            self.wait(time.monotonic() + grace_s, spare)
        return self.kill(spare, group)

    def kill(self, spare: int | None = None, group: bool = True) -> list[Child]:
        """SIGKILL every child but `spare` and wait at most `KILL_WAIT_S` for each to end; those that outlive it are
        named (logged: on the console, and in the job's log) and left behind, and returned."""
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
    """Wait until the processes `pids` (children of this one or not) have ended, or `deadline` (monotonic) passed:
    by their pidfds."""
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
    """Wait for process `pid`, a child of this one, to end (by its pidfd: not by a channel its forks may hold open)
    and reap it; its exit code. One already reaped counts as ended by SIGKILL (its code is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return -signal.SIGKILL
    select.select([fd], [], [])
    return _reaped(fd)


def _reaped(pidfd: int) -> int:
    """Reap the child that `pidfd` (readable: it ended) refers to, and close `pidfd`; its exit code (one reaped
    elsewhere meanwhile counts as ended by SIGKILL)."""
    try:
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:
        return -signal.SIGKILL
    finally:
        os.close(pidfd)
    assert status is not None
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
