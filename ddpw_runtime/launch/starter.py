"""The controller's handle on its rank starter: the helper process that starts the ranks of every job
and reports their exits (the process itself is `starter_process.py`).

With `spawn_method=forkserver` the starter holds torch imported and forks each rank from itself, so a
sweep pays the torch import once, not once per rank per job. When the controller has imported a CPU
build of torch already (a training script usually has), the starter is a fork of the controller, made
while it has a single thread, so the ranks find torch and the user's imports loaded; otherwise (a CUDA
build, where a forked copy of a process that touched CUDA cannot use it) it is a fresh interpreter
that imports torch. With `spawn` it is a fresh interpreter that starts a fresh interpreter per rank.

The two talk over a socket pair (`Channel`): `StartRank` (with the rendezvous socket attached for the
rank that hosts the store) is answered by `RankStarted`; `RankExited` comes when a rank ends.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ddpw_runtime.launch.signals import STOPPING_SIGNALS, held

_ANSWER_WAIT_S = 30.0
"""The longest wait for the starter's answer (it stops a job's processes in 6 s at most)."""
_CLOSE_WAIT_S = 5.0
"""How long closing a starter waits for it to exit (it kills its ranks first) before killing it."""


@dataclass(frozen=True)
class StartRank:
    """Start local rank `local_rank` of the job whose payload is at `payload_path`. Attached
    descriptors follow, in this order: the rendezvous socket when `listen_fd` (the rank that hosts the
    store), the rank's terminal when `terminal` (a console rank on a terminal console)."""

    payload_path: str
    local_rank: int
    exec_fresh: bool
    listen_fd: bool = False
    terminal: bool = False


@dataclass(frozen=True)
class EndJob:
    """Every rank of the job whose files are in `job` has ended: stop whatever they started (processes in
    new sessions included, see `job_processes.py`)."""

    job: str


@dataclass(frozen=True)
class JobEnded:
    """Answer to `EndJob`: the pids of the job's processes that would not die (none, normally)."""

    job: str
    left: tuple[int, ...]


@dataclass(frozen=True)
class RankStarted:
    """Answer to `StartRank`: the rank's pid."""

    local_rank: int
    pid: int


@dataclass(frozen=True)
class RankExited:
    """A rank ended; `exit_code` is negative for a signal, as in `subprocess`."""

    pid: int
    exit_code: int


class Channel:
    """Pickled messages over a Unix stream socket, each able to carry file descriptors."""

    _HEADER = struct.Struct("!I")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        """The socket's descriptor (for `select`)."""
        return self.sock.fileno()

    def send(self, message: object, fds: Sequence[int] = ()) -> None:
        """Send `message`, with `fds` attached."""
        data = pickle.dumps(message)
        frame = self._HEADER.pack(len(data)) + data
        sent = socket.send_fds(self.sock, [frame], list(fds)) if fds else self.sock.send(frame)
        if sent < len(frame):
            self.sock.sendall(frame[sent:])

    def recv(self) -> tuple[object, list[int]]:
        """The next message and the descriptors attached to it; EOFError when the other side closed."""
        head, fds, _, _ = socket.recv_fds(self.sock, self._HEADER.size, 4)
        head += self._exactly(self._HEADER.size - len(head))
        (length,) = self._HEADER.unpack(head)
        return pickle.loads(self._exactly(length)), fds

    def poll(self, timeout: float | None, wake_fd: int | None = None) -> bool:
        """Whether a message is waiting (waits at most `timeout` seconds, None: until one comes, or
        until `wake_fd` becomes readable)."""
        watched = [self.sock.fileno()] if wake_fd is None else [self.sock.fileno(), wake_fd]
        ready, _, _ = select.select(watched, [], [], timeout)
        return self.sock.fileno() in ready

    def _exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise EOFError("the other side closed the channel")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class RankStarter:
    """Controller-side handle on a starter process (see the module docstring)."""

    def __init__(self, preload: bool) -> None:
        ours, theirs = socket.socketpair()
        self.preload = preload
        self._exits: list[RankExited] = []
        self._process: subprocess.Popen[bytes] | None = None
        controller = os.getpid()
        if preload and _can_fork_controller():
            # A forked copy of this process has the user's imports (and torch, when loaded here) and
            # skips an interpreter's start-up; it imports torch itself if need be.
            # Ctrl-C and SIGTERM are held back over the fork: a handler that raised inside `os.fork()`'s
            # at-fork hooks would be reported as unraisable and lost. They come right after, in this
            # process; the starter sets its own handlers before it lets them in.
            before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
            try:
                with warnings.catch_warnings():  # Python 3.12+ warns about native threads; see above
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.pid = os.fork()
            finally:
                if os.getpid() == controller:
                    signal.pthread_sigmask(signal.SIG_SETMASK, before)
            if self.pid == 0:
                ours.close()
                try:
                    from ddpw_runtime.launch.starter_process import serve

                    serve(Channel(theirs), True, controller, before)
                finally:
                    os._exit(0)
        else:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "ddpw_runtime.launch.starter_process", str(theirs.fileno()),
                 "1" if preload else "0", str(controller)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
            self.pid = self._process.pid
        theirs.close()
        self.channel = Channel(ours)

    def alive(self) -> bool:
        """Whether the starter process is still running."""
        if self._process is not None:
            return self._process.poll() is None
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def start(
        self, payload_path: str, local_rank: int, listen_fd: int | None = None, terminal: int | None = None
    ) -> int:
        """Start one rank, handing it `listen_fd` (the rendezvous socket) and `terminal` (where its output
        goes instead of its log file) if given; returns its pid (in milliseconds). Call it with Ctrl-C and
        SIGTERM held (`signals.held`), and note the pid before letting them in: a rank must never run
        unbeknown to the controller."""
        request = StartRank(payload_path, local_rank, exec_fresh=not self.preload, listen_fd=listen_fd is not None,
                            terminal=terminal is not None)
        self.channel.send(request, [fd for fd in (listen_fd, terminal) if fd is not None])
        while True:
            message = self._recv(_ANSWER_WAIT_S)
            if message is None:
                raise RuntimeError(f"the rank starter (pid {self.pid}) did not start rank {local_rank} "
                                   f"within {_ANSWER_WAIT_S:.0f} s")
            if isinstance(message, RankStarted):
                return message.pid
            assert isinstance(message, RankExited)
            self._exits.append(message)

    def end_job(self, job: str) -> tuple[int, ...]:
        """Stop every process the ranks of `job` (its private folder) started; the pids that would not die.
        Ctrl-C and SIGTERM wait until the answer is in (at most a few seconds: see `job_processes.py`)."""
        with held():
            self.channel.send(EndJob(job))
            while True:
                message = self._recv(_ANSWER_WAIT_S)
                if message is None:
                    raise RuntimeError(f"the rank starter (pid {self.pid}) did not stop a job's processes "
                                       f"within {_ANSWER_WAIT_S:.0f} s")
                if isinstance(message, JobEnded) and message.job == job:
                    return message.left
                assert isinstance(message, RankExited)
                self._exits.append(message)

    def next_exit(self, timeout: float | None, wake_fd: int | None = None) -> RankExited | None:
        """The next rank that ended, or None when `timeout` seconds pass first or `wake_fd` becomes
        readable."""
        if self._exits:
            return self._exits.pop(0)
        message = self._recv(timeout, wake_fd)
        assert message is None or isinstance(message, RankExited)
        return message

    def _recv(self, timeout: float | None, wake_fd: int | None = None) -> object | None:
        if not self.channel.poll(timeout, wake_fd):
            return None
        try:
            with held():  # a message is read whole, or not at all
                message, _ = self.channel.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the rank starter (pid {self.pid}) died") from exc
        return message

    def close(self) -> None:
        """Stop the starter (it kills any rank still running); kill it if it has not exited within
        `_CLOSE_WAIT_S`."""
        self.channel.close()
        deadline = time.monotonic() + _CLOSE_WAIT_S
        while not self._reaped():
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.005)

    def _reaped(self) -> bool:
        if self._process is not None:
            return self._process.poll() is not None
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return True


def _can_fork_controller() -> bool:
    """Whether this process can safely be forked into a starter: no Python thread but this one (forking
    one can copy a held lock), and torch either not imported yet (the starter imports it, while this
    process goes on) or a build without CUDA (with CUDA, merely counting GPUs makes torch refuse CUDA in
    forked children, and that cannot be seen from here). Native worker pools (OpenBLAS, OpenMP) handle
    fork themselves, as in every DataLoader worker."""
    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and (torch is None or torch.version.cuda is None)


_starters: dict[bool, RankStarter] = {}


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
