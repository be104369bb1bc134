"""The rank starter process (`launch/starter.py` is the controller's handle on it): forks (or, with `spawn`, execs)
each rank and job process and reports every exit. Every process of a job is tracked (`job_processes.py`), so what its
ranks started is stopped when the job ends (`EndJob`). When the controller goes away (even by SIGKILL) the starter gets
SIGHUP (PR_SET_PDEATHSIG) or sees its socket close: it stops every job's processes, removes their private folders and
exits; each rank gets SIGKILL if the starter dies first. Run as `python -m ddpw_runtime.procs.starter FD PRELOAD
CONTROLLER_PID`, or called in a fork of the controller."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import select
import shutil
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from ddpw_runtime import _compat
from ddpw_runtime.launch import protocol
from ddpw_runtime.launch.job_processes import JobProcesses, children_of_this_process
from ddpw_runtime.launch.plan import DUMP_SIGNAL
from ddpw_runtime.launch.protocol import Channel
from ddpw_runtime.launch.signals import blocked, send_to_group

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def adopt_orphans() -> None:
    """Make what this process's descendants leave behind its children, not init's, to be stopped and reaped here
    (Linux only; not inherited by a fork)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def serve(channel: Channel, preload: bool, controller: int, signal_mask: Iterable[int] | None = None) -> None:
    """Serve `channel` until the controller (pid `controller`) closes it or dies. The starter leads its own session,
    so a signal to the controller's process group (a terminal's, `kill -9 -PGID`) does not end it before it stopped
    the ranks. `signal_mask`: set once its handlers are (a controller's fork starts with Ctrl-C, SIGTERM held)."""
    if os.getsid(0) != os.getpid():
        os.setsid()
    die_with_parent(signal.SIGHUP)
    adopt_orphans()  # what a rank left behind stays here until its job ends; the starter reaps it
    if os.getppid() != controller:  # it died before that took effect
        os._exit(0)
    server = _Server(channel, preload)
    if signal_mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
    server.serve()


class _Server:
    """The starter's loop: requests from the controller's channel and each job process's; each rank's exit goes back
    on the channel that asked for it."""

    def __init__(self, channel: Channel, preload: bool) -> None:
        self.controller = channel
        self.preload = preload
        self.channels: list[Channel] = [channel]
        self.ranks: dict[int, tuple[JobProcesses | None, Channel]] = {}
        """The job (None for a job process) of each running child, and the channel its exit goes to."""
        self.jobs: dict[str, tuple[JobProcesses, Channel]] = {}
        self.job_folders: dict[int, str] = {}
        """The private folder of each running job process (removed with the rest if the controller dies)."""
        self.pid = os.getpid()
        if preload:
            from ddpw_runtime.rank.setup import warm_up  # imports torch and torch.distributed once

            warm_up()
        _compat.forget_exit_handlers()  # the controller's: they would run in its ranks as they end (`procs/rank.py`)
        # The ranks it forks share what the controller holds (torch, once loaded): frozen, their garbage collector
        # does not walk it, so they do not copy every page of it.
        gc.freeze()
        # Ctrl-C is the controller's: a handler that does nothing (not SIG_IGN, which would drop a Ctrl-C sent to a
        # child between its fork and its own handler; see `_fork`).
        signal.signal(signal.SIGINT, lambda *_: None)
        # A stack request (`DUMP_SIGNAL`) reaching a rank before `run_rank` sets its handler is ignored (forked or
        # exec'd), not taken by its default action, which would end the rank as killed by it.
        signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, self.end)
        # SIGTERM is ignored (its controller ends it): one that reaches every process of the job (`pkill -f train.py`,
        # a service manager's stop, SLURM's scancel) is the ranks' to handle, with their controller's grace, instead of
        # the starter killing them at once as it ends.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([*(c.fileno() for c in self.channels), self.wake_r], [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self._reap()
            for channel in [c for c in self.channels if c.fileno() in ready]:
                try:
                    request, fds = channel.recv()
                except (EOFError, OSError):
                    self._closed(channel)
                    continue
                self._handle(channel, request, fds)

    def _handle(self, channel: Channel, request: object, fds: list[int]) -> None:
        if isinstance(request, protocol.EndJob):
            self._end_job(request, channel)
        elif isinstance(request, protocol.Preload):
            for name in request.modules:
                with contextlib.suppress(Exception):  # a module that does not import here is not preloaded
                    importlib.import_module(name)
        elif isinstance(request, protocol.Adopt):
            self._job(request.job, channel).adopt(request.pid)
            channel.send(protocol.RankStarted(request.request, request.pid))
        elif isinstance(request, protocol.StartJob):
            pid = self._start_job(request)
            self.ranks[pid] = (None, channel)
            self.job_folders[pid] = str(Path(request.payload_path).parent)
            channel.send(protocol.RankStarted(request.request, pid))
        else:
            assert isinstance(request, protocol.StartRank)
            terminal = fds[0] if request.terminal else None
            job = self._job(request.job, channel)
            pid = self._start(request, job, terminal)
            for fd in fds:
                os.close(fd)
            self.ranks[pid] = (job, channel)
            channel.send(protocol.RankStarted(request.request, pid))

    def _job(self, key: str, channel: Channel) -> JobProcesses:
        """The processes of the job `key` (known from its first rank or adopted process on)."""
        if key not in self.jobs:
            self.jobs[key] = (JobProcesses(key), channel)
        return self.jobs[key][0]

    def _closed(self, channel: Channel) -> None:
        """A channel closed: the controller's ends everything; a job process's, what it started."""
        if channel is self.controller:
            self.end()
        self.channels.remove(channel)
        channel.close()
        self._stop(channel)

    def _stop(self, channel: Channel | None = None) -> None:
        """Kill the ranks and stop the jobs (removing their private folders) that `channel` asked for (None: all)."""
        for pid, (_, owner) in list(self.ranks.items()):
            if channel is None or owner is channel:
                send_to_group(pid, signal.SIGKILL)
        for key, (job, owner) in list(self.jobs.items()):
            if channel is None or owner is channel:
                del self.jobs[key]
                job.stop()
                shutil.rmtree(key, ignore_errors=True)

    def _fork(self, run: Callable[[], int], death_signal: int = signal.SIGKILL) -> int:
        """Fork a process that calls `run` and exits with its code (reporting what it raises); its pid. The child has
        its own session, gets `death_signal` when the starter dies, keeps none of the starter's descriptors and
        handlers, and starts with Ctrl-C held (it lets it through once its own handler is set)."""
        with blocked((signal.SIGINT,)):
            pid = os.fork()
            if pid:
                return pid
            code = 1
            try:
                for sig in (signal.SIGCHLD, signal.SIGHUP, signal.SIGTERM):  # first: none runs `end` here
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                os.setsid()
                die_with_parent(death_signal)
                if os.getppid() != self.pid:
                    os._exit(1)
                for fd in (self.wake_r, self.wake_w, *(c.fileno() for c in self.channels)):
                    os.close(fd)
                code = run()
            except BaseException:  # report anything, then leave without cleanup handlers
                traceback.print_exc()
            finally:
                os._exit(code)

    def _start_job(self, request: protocol.StartJob) -> int:
        """Fork a job process (`procs/job.py`), with a channel of its own to this starter."""
        ours, theirs = socket.socketpair()

        def job_process() -> int:
            ours.close()
            signal.signal(signal.SIGINT, signal.default_int_handler)  # let through by the job process
            return request.run(request.payload_path, Channel(theirs), self.pid, self.preload)

        # A job process that outlives this starter (OOM-killed, say) gets SIGTERM: it ends as when stopped, stopping
        # what its ranks started itself (`NodeRanks.end`).
        pid = self._fork(job_process, signal.SIGTERM)
        theirs.close()
        self.channels.append(Channel(ours))
        return pid

    def _start(self, request: protocol.StartRank, job: JobProcesses, terminal: int | None) -> int:
        def rank() -> int:
            # Ctrl-C is held (`_fork`) until the rank's output goes to its log (`run_rank` lets it through), so a rank
            # stopped as it starts reports it like any rank, not on the controller's terminal.
            signal.signal(signal.SIGINT, signal.default_int_handler if self.preload else signal.SIG_DFL)
            if not self.preload:  # `spawn`: a fresh interpreter
                job.adopt(0)
                if terminal is not None:
                    os.set_inheritable(terminal, True)
                args = [request.payload_path, str(request.local_rank), "-" if terminal is None else str(terminal)]
                os.execv(sys.executable, [sys.executable, "-m", "ddpw_runtime.procs.rank", *args])
            from ddpw_runtime.procs.rank import run_rank

            return run_rank(request.payload_path, request.local_rank, terminal, job.adopt)

        return self._fork(rank)

    def _reap(self) -> None:
        """Report the ranks (and job processes) that ended."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            started = self.ranks.pop(pid, None)
            if started is None:  # a process a rank left behind (see `serve`)
                continue
            job, channel = started
            self.job_folders.pop(pid, None)
            if job is not None:
                # What the rank started gets SIGTERM now (helpers that clean up after it, such as multiprocessing's
                # resource tracker, ignore it and finish); `protocol.EndJob` sweeps the rest.
                send_to_group(pid, signal.SIGTERM)
            with contextlib.suppress(OSError):  # that channel's process is gone
                channel.send(protocol.RankExited(pid, os.waitstatus_to_exitcode(status)))

    def _end_job(self, request: protocol.EndJob, channel: Channel) -> None:
        job, _ = self.jobs.pop(request.job, (None, None))
        left: list[int] = []
        if job is not None:
            for pid in request.release:
                job.release(pid)
            left = job.stop()
        channel.send(protocol.JobEnded(request.request, tuple(left)))

    def end(self, *signal_args: Any) -> NoReturn:
        """The controller is gone (see the module docstring); also the handler of SIGHUP."""
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self._stop()
        for pid in children_of_this_process():  # left behind by ranks, and not found as any job's (see `serve`)
            send_to_group(pid, signal.SIGKILL, group=False)
        for folder in self.job_folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)


if __name__ == "__main__":
    serve(Channel(socket.socket(fileno=int(sys.argv[1]))), sys.argv[2] == "1", int(sys.argv[3]))
