"""The rank starter process (see `starter.py` for the controller's handle and the messages).

It forks each rank (or, with `spawn`, execs a fresh interpreter for it) and reports every exit. Every
rank leads its own process group, so stopping it stops what it started. When the controller goes away
(even by SIGKILL) the starter sees its socket close, kills every rank and exits; it also dies with the
controller (PR_SET_PDEATHSIG), and so does each rank with the starter.

Run as `python -m ddpw_runtime.launch.starter_process FD PRELOAD`, or called in a fork of the controller.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import traceback

from ddpw_runtime.launch.signals import send_to_group
from ddpw_runtime.launch.starter import Channel, RankExited, RankStarted, StartRank

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def serve(channel: Channel, preload: bool) -> None:
    """Serve `channel` until the controller closes it."""
    die_with_parent()
    _Server(channel, preload).serve()


class _Server:
    def __init__(self, channel: Channel, preload: bool) -> None:
        self.channel = channel
        self.children: set[int] = set()
        self.pid = os.getpid()
        if preload:
            from ddpw_runtime.rank.setup import warm_up  # imports torch and torch.distributed once

            warm_up()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.channel.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self._reap()
            if self.channel.fileno() in ready:
                try:
                    request, fds = self.channel.recv()
                except (EOFError, OSError):
                    self._kill_all()
                    return
                assert isinstance(request, StartRank)
                attached = iter(fds)
                listen_fd = next(attached) if request.listen_fd else None
                terminal = next(attached) if request.terminal else None
                pid = self._start(request, listen_fd, terminal)
                for fd in fds:
                    os.close(fd)
                self.children.add(pid)
                self.channel.send(RankStarted(request.local_rank, pid))

    def _start(self, request: StartRank, listen_fd: int | None, terminal: int | None) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setsid()
            die_with_parent()
            if os.getppid() != self.pid:
                os._exit(1)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL if request.exec_fresh else signal.default_int_handler)
            for fd in (self.wake_r, self.wake_w, self.channel.fileno()):
                os.close(fd)
            if request.exec_fresh:
                for passed in (listen_fd, terminal):
                    if passed is not None:
                        os.set_inheritable(passed, True)
                args = [request.payload_path, str(request.local_rank), *(_arg(fd) for fd in (listen_fd, terminal))]
                os.execv(sys.executable, [sys.executable, "-m", "ddpw_runtime.rank.entry", *args])
            from ddpw_runtime.rank.entry import run_rank

            code = run_rank(request.payload_path, request.local_rank, listen_fd, terminal)
        except BaseException:  # report anything, then leave without cleanup handlers
            traceback.print_exc()
        finally:
            os._exit(code)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            send_to_group(pid, signal.SIGKILL)  # whatever the rank started dies with it
            self.channel.send(RankExited(pid, os.waitstatus_to_exitcode(status)))

    def _kill_all(self) -> None:
        for pid in list(self.children):
            send_to_group(pid, signal.SIGKILL)


def _arg(fd: int | None) -> str:
    return "-" if fd is None else str(fd)


if __name__ == "__main__":
    import socket

    serve(Channel(socket.socket(fileno=int(sys.argv[1]))), sys.argv[2] == "1")
