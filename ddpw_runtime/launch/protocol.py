"""The typed messages a job's processes exchange over a Unix socket pair (`Channel`): a controller and its rank starter
(`StartRank`/`StartJob`/`Adopt` answered by `RankStarted`, `EndJob` by `JobEnded`, then `RankExited`; `Preload`
unanswered), a plain run's supervisor and rank 0 (`JobStarting` answered by `RankZero`, `TaskEnded` by `JobSettled`,
`RunEnded` last). `job`: the job's private folder (payload, results); `request` numbers a request. Data only."""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ddpw_runtime.launch.plan import LaunchPlan
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.records import RankResult


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


class StartRank(NamedTuple):
    """Start local rank `local_rank` of `job` from its payload at `payload_path`; attached: the rank's terminal when
    `terminal` (a console rank)."""

    request: int
    job: str
    payload_path: str
    local_rank: int
    terminal: bool = False


class StartJob(NamedTuple):
    """Fork a multirun job's process that runs `run(payload_path, channel, starter_pid, preload)` and exits with what it
    returns (its ranks use its own channel); `run` travels by reference, so the starter imports no job process code."""

    request: int
    payload_path: str
    run: Callable[[str, Channel, int, bool], int]


class Adopt(NamedTuple):
    """Count process `pid` (started elsewhere: a plain run's rank 0, the user's own process) as one of `job`'s, so what
    it starts is stopped with the job; answered once it is in the job's cgroup, before it is told to go on."""

    request: int
    job: str
    pid: int


class Preload(NamedTuple):
    """Import `modules` in the starter (those that fail to import are skipped); no answer."""

    modules: tuple[str, ...]


class EndJob(NamedTuple):
    """Every rank of `job` has ended: stop whatever they started (new sessions too, `job_processes.py`), but not those
    in `release` (adopted ones, ranks already left behind), which are let go first."""

    request: int
    job: str
    release: tuple[int, ...] = ()


class JobEnded(NamedTuple):
    """Answer to `EndJob` number `request`: the pids of the job's processes that would not die (none, normally)."""

    request: int
    left: tuple[int, ...]


class RankStarted(NamedTuple):
    """Answer to `StartRank`, `StartJob` or `Adopt` number `request`: the process's pid."""

    request: int
    pid: int


class RankExited(NamedTuple):
    """A rank ended; `exit_code` is negative for a signal, as in `subprocess`."""

    pid: int
    exit_code: int


class JobStarting(NamedTuple):
    """From rank 0's process: the job's task is about to run there. `task`: the packed `TaskCall` the other ranks run;
    `state`: rank 0's process state they take on; `overrides`: as typed (every other node compares its own)."""

    task: bytes
    state: ProcessState
    log_dir: str
    overrides: tuple[str, ...] = ()


class RankZero(NamedTuple):
    """To rank 0's process: be rank 0 of `plan`, with `env` added, and join the store the supervisor serves; once
    joined, make the file `task_mark` (`RankPayload.task_mark`). Attached: its terminal when `terminal`."""

    plan: LaunchPlan
    env: dict[str, str]
    terminal: bool
    task_mark: str


class TaskEnded(NamedTuple):
    """From rank 0's process: its task ended as `result` (None: stopped or interrupted); it left the process group."""

    result: RankResult | None


class ExitBegan(NamedTuple):
    """From rank 0's process: it began to exit (its `atexit` handlers run) at `at` (`time.time`) while its task ran, as
    a `sys.exit(0)` in the task ends it; its connections to its peers are still open."""

    at: float


class JobSettled(NamedTuple):
    """To rank 0's process, answering `TaskEnded` (or instead of `RankZero`): how the job ended. `error`: its failure
    (pickled) unless rank 0's own; `restart`: a `RankZero` follows; `stopped`: the signal that interrupted it.
    Attached, unless `restart`: where its fds 1 and 2 write from now on, until it ends (console and rank 0's log)."""

    error: bytes | None
    restart: bool = False
    stopped: int | None = None


class RunEnded(NamedTuple):
    """From rank 0's process: Hydra's run is over; `threads`: the non-daemon threads that keep the program alive."""

    threads: tuple[str, ...]
