"""The rank starter: a helper process that starts the ranks of every job and reports their exits.

With `spawn_method=forkserver` it holds torch imported and forks each rank from itself, so a sweep pays
the torch import once, not once per rank per job; with `spawn` it starts a fresh interpreter per rank.
The user's script is never re-imported in a rank: the task travels by value (cloudpickle). When the
controller has imported a CPU build of torch already (a training script usually has), the starter is a
fork of the controller, made while it has a single thread, so the ranks find torch and the user's
imports loaded; otherwise (a CUDA build, where a forked copy of a process that touched CUDA cannot use
it) it is a fresh interpreter that imports torch.

Every rank is the leader of its own process group, so stopping it also stops what it started. When the
controller goes away (even by SIGKILL) the starter sees its socket close, kills every rank and exits;
each rank also gets SIGKILL if the starter dies first (PR_SET_PDEATHSIG).

Protocol over a socket pair, pickled tuples: ("start", payload_path, local_rank, exec_fresh, has_fd)
(followed, when has_fd, by the rendezvous socket passed with SCM_RIGHTS, which only that rank keeps) is
answered by ("started", local_rank, pid); ("exited", pid, exit_code) is sent when a rank ends, the exit
code being negative for a signal, as in `subprocess`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import warnings
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Dict, List, Optional, Set, Tuple

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Server:
    def __init__(self, conn: Connection, preload: bool) -> None:
        self.conn = conn
        self.children: Set[int] = set()
        self.pid = os.getpid()
        if preload:
            from ddpw_runtime.rank_process import warm_up  # imports torch and torch.distributed once

            warm_up()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.conn.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self._reap()
            if self.conn.fileno() in ready:
                try:
                    request = self.conn.recv()
                except (EOFError, OSError):
                    self._kill_all()
                    return
                if request[0] == "start":
                    _, payload, local_rank, exec_fresh, has_fd = request
                    listen_fd = recv_handle(self.conn) if has_fd else None
                    pid = self._start(payload, local_rank, exec_fresh, listen_fd)
                    if listen_fd is not None:
                        os.close(listen_fd)
                    self.children.add(pid)
                    self.conn.send(("started", local_rank, pid))

    def _start(self, payload: str, local_rank: int, exec_fresh: bool, listen_fd: Optional[int]) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setsid()
            _die_with_parent()
            if os.getppid() != self.pid:
                os._exit(1)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL if exec_fresh else signal.default_int_handler)
            for fd in (self.wake_r, self.wake_w, self.conn.fileno()):
                os.close(fd)
            if exec_fresh:
                argv = [sys.executable, "-m", "ddpw_runtime.rank_process", payload, str(local_rank)]
                if listen_fd is not None:
                    os.set_inheritable(listen_fd, True)
                    argv.append(str(listen_fd))
                os.execv(sys.executable, argv)
            from ddpw_runtime.rank_process import main

            code = main(payload, local_rank, listen_fd)
        except BaseException:  # noqa: BLE001 - report anything, then leave without cleanup handlers
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
            _kill_group(pid, signal.SIGKILL)  # whatever the rank started dies with it
            self.conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))

    def _kill_all(self) -> None:
        for pid in list(self.children):
            _kill_group(pid, signal.SIGKILL)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class RankStarter:
    """Controller-side handle on a starter process (see the module docstring)."""

    def __init__(self, preload: bool) -> None:
        ours, theirs = socket.socketpair()
        self.preload = preload
        self._exits: List[Tuple[int, int]] = []
        self._process: Optional[subprocess.Popen] = None
        if preload and _can_fork_controller():
            # torch (and the user's own imports) are loaded here already: a forked copy of this
            # process is a ready starter, with no second torch import.
            with warnings.catch_warnings():  # Python 3.12+ warns about native threads; see above
                warnings.simplefilter("ignore", DeprecationWarning)
                self.pid = os.fork()
            if self.pid == 0:
                ours.close()
                try:
                    _die_with_parent()
                    _Server(Connection(theirs.detach()), preload=True).serve()
                finally:
                    os._exit(0)
        else:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "ddpw_runtime.starter", str(theirs.fileno()), "1" if preload else "0"],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
            self.pid = self._process.pid
        theirs.close()
        self.conn = Connection(ours.detach())

    def alive(self) -> bool:
        """Whether the starter process is still running."""
        if self._process is not None:
            return self._process.poll() is None
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def start(self, payload: str, local_rank: int, listen_fd: Optional[int] = None) -> int:
        """Start one rank, handing it `listen_fd` (the rendezvous socket) if given; returns its pid."""
        self.conn.send(("start", payload, local_rank, not self.preload, listen_fd is not None))
        if listen_fd is not None:
            send_handle(self.conn, listen_fd, self.pid)
        while True:
            message = self._recv(None)
            if message is None:
                raise RuntimeError("the rank starter exited while starting a rank")
            if message[0] == "started":
                return int(message[2])
            self._exits.append((message[1], message[2]))

    def next_exit(self, timeout: Optional[float]) -> Optional[Tuple[int, int]]:
        """The next (pid, exit code) of a finished rank, or None when `timeout` passes first."""
        if self._exits:
            return self._exits.pop(0)
        message = self._recv(timeout)
        if message is None:
            return None
        return message[1], message[2]

    def _recv(self, timeout: Optional[float]) -> Optional[tuple]:
        if not self.conn.poll(timeout):
            return None
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the rank starter (pid {self.pid}) died") from exc

    def close(self) -> None:
        """Stop the starter; it kills any rank still running."""
        self.conn.close()
        if self._process is not None:
            self._process.wait()
        else:
            os.waitpid(self.pid, 0)


def _can_fork_controller() -> bool:
    """Whether this process can safely be forked into a starter: torch imported, a build without CUDA
    (with CUDA, merely counting GPUs makes torch refuse CUDA in forked children, and that cannot be
    seen from here), and no Python thread but this one (forking one can copy a held lock). Native
    worker pools (OpenBLAS, OpenMP) handle fork themselves, as in every DataLoader worker."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.version.cuda is None and threading.active_count() == 1


_starters: Dict[bool, RankStarter] = {}


def get_starter(preload: bool) -> RankStarter:
    """The starter of this process for `preload` (torch preloaded or not), started on first use."""
    starter = _starters.get(preload)
    if starter is None or not starter.alive():
        if not _starters:
            atexit.register(close_starters)
        starter = _starters[preload] = RankStarter(preload)
    return starter


def close_starters() -> None:
    """Stop every starter of this process."""
    while _starters:
        _starters.popitem()[1].close()


if __name__ == "__main__":
    _die_with_parent()
    _Server(Connection(int(sys.argv[1])), sys.argv[2] == "1").serve()
