"""The controller's handle on its rank starter, the helper process that starts every job's ranks and reports their exits
(`procs/starter.py`; docs/architecture.md, "Rank starter instead of `multiprocessing`"). Jobs side by side share one: a
reader thread hands each answer to the thread that asked, each exit to its job's `Inbox`."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from ddpw_runtime import _compat
from ddpw_runtime.launch.bounds import ANSWER_WAIT_S, CLOSE_WAIT_S
from ddpw_runtime.launch.children import Children, Inbox, StarterGone
from ddpw_runtime.launch.protocol import (
    Adopt,
    Channel,
    EndJob,
    JobEnded,
    Preload,
    RankExited,
    RankStarted,
    StartJob,
    StartRank,
)
from ddpw_runtime.launch.signals import STOPPING_SIGNALS, blocked, held

_A = TypeVar("_A", RankStarted, JobEnded)


class RankStarter:
    """A handle on a starter process, for several threads; `attached_to`: another process's starter, else our own."""

    def __init__(self, preload: bool, attached_to: tuple[Channel, int] | None = None) -> None:
        self.preload = preload
        self._process: subprocess.Popen[bytes] | None = None
        self._owned = attached_to is None
        self._requests = itertools.count()
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._answers: dict[int, queue.SimpleQueue[object]] = {}  # who waits for the answer to which request
        self._inbox_of_request: dict[int, Inbox] = {}
        self._inbox_of_pid: dict[int, Inbox] = {}
        self._gone: StarterGone | None = None
        self.channel, self.pid = attached_to if attached_to is not None else _in_a_lasting_thread(self._launch)
        if self._owned:
            launched.add(self.pid)
        self.reader = threading.Thread(target=self._read, name="ddpw-rank-starter", daemon=True)
        """The thread that hears the starter."""
        self.reader.start()

    def _launch(self) -> tuple[Channel, int]:
        ours, theirs = socket.socketpair()
        controller = os.getpid()
        if self.preload and _can_fork_controller():
            # A fork has the user's imports (and torch) and skips an interpreter's start-up. With torch, what the
            # starter imports for every rank is imported here first (a fork's imports copy each page they touch).
            if "torch" in sys.modules:
                from ddpw_runtime.rank.setup import warm_up

                warm_up()
            # Ctrl-C and SIGTERM are held over the fork: here they come right after it (and see `serve`).
            with blocked(STOPPING_SIGNALS) as before:
                with warnings.catch_warnings():  # Python 3.12+ warns about native threads; see above
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
                if pid == 0:
                    ours.close()
                    try:
                        from ddpw_runtime.procs.starter import serve

                        serve(Channel(theirs), True, controller, before)
                    finally:
                        os._exit(0)
        else:
            # A session of its own: a terminal's Ctrl-C would reach it while it imports, before its handlers are set
            # (a traceback on the console); its controller ends it (`close`, PDEATHSIG), as it does a forked one.
            self._process = subprocess.Popen([sys.executable, "-m", "ddpw_runtime.procs.starter", str(theirs.fileno()),
                                              "1" if self.preload else "0", str(controller)],
                                             pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            pid = self._process.pid
        theirs.close()
        return Channel(ours), pid

    def _read(self) -> None:
        """Hand each message to whoever waits for it, until the channel closes."""
        while True:
            try:
                message, _ = self.channel.recv()
            except (EOFError, OSError):
                break
            with self._state_lock:
                if isinstance(message, RankStarted) and message.request in self._inbox_of_request:
                    self._inbox_of_pid[message.pid] = self._inbox_of_request.pop(message.request)
                if isinstance(message, (RankStarted, JobEnded)) and message.request in self._answers:
                    self._answers[message.request].put(message)
                elif isinstance(message, RankExited) and message.pid in self._inbox_of_pid:
                    self._inbox_of_pid.pop(message.pid).put(message)
        with self._state_lock:
            self._gone = StarterGone.of(self.pid)
            for waiting in self._answers.values():
                waiting.put(self._gone)
            for inbox in {*self._inbox_of_request.values(), *self._inbox_of_pid.values()}:
                inbox.put(self._gone)

    def _ask(self, request: StartRank | StartJob | Adopt | EndJob, fds: Sequence[int], what: str, answer_type: type[_A],
             inbox: Inbox | None = None) -> _A:
        """Send `request`, wait at most `ANSWER_WAIT_S` for its answer; the exit of what it starts goes to `inbox`."""
        waiting: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._state_lock:
            if self._gone is not None:
                raise self._gone
            self._answers[request.request] = waiting
            if inbox is not None:
                self._inbox_of_request[request.request] = inbox
        try:
            with self._send_lock:
                self.channel.send(request, fds)
            try:
                answer = waiting.get(timeout=ANSWER_WAIT_S)
            except queue.Empty:
                raise RuntimeError(f"the rank starter (pid {self.pid}) did not {what} within "
                                   f"{ANSWER_WAIT_S:.0f} s") from None
        except OSError as exc:
            raise StarterGone.of(self.pid) from exc
        finally:
            with self._state_lock:
                self._answers.pop(request.request, None)
        if isinstance(answer, StarterGone):
            raise answer
        assert isinstance(answer, answer_type)
        return answer

    def alive(self) -> bool:
        """Whether the starter process is still running."""
        if not self._owned:
            return self._gone is None
        if self._process is not None:
            return self._process.poll() is None
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def start(self, inbox: Inbox, job: str, payload_path: str, local_rank: int, terminal: int | None = None) -> int:
        """Start one rank of `job`, its exit to go to `inbox`, handing it `terminal` (its output instead of its log
        file); its pid. Call it with Ctrl-C and SIGTERM held (`signals.held`) and note the pid before letting them in:
        no rank may run unbeknown to the controller."""
        request = StartRank(next(self._requests), job, payload_path, local_rank, terminal is not None)
        fds = [terminal] if terminal is not None else []
        return self._ask(request, fds, f"start rank {local_rank}", RankStarted, inbox).pid

    def start_job(self, inbox: Inbox, payload_path: str, run: Callable[[str, Channel, int, bool], int]) -> int:
        """Start a job process that calls `run` (`StartJob`), its exit to go to `inbox`; its pid."""
        request = StartJob(next(self._requests), payload_path, run)
        return self._ask(request, (), "start a job process", RankStarted, inbox).pid

    def adopt(self, job: str, pid: int) -> None:
        """Count `pid`, a process started elsewhere, as one of `job`'s (`Adopt`) once this returns."""
        self._ask(Adopt(next(self._requests), job, pid), (), "count a process as the job's", RankStarted)

    def preload_modules(self, modules: Sequence[str]) -> None:
        """Have the starter import `modules` for the ranks it starts from now on."""
        if modules and self.preload:
            with self._send_lock, contextlib.suppress(OSError):  # (no answer: a starter gone is seen by the next ask)
                self.channel.send(Preload(tuple(modules)))

    def end_job(self, job: str, release: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Stop what `job`'s ranks started, but `release`; the pids that would not die. Held (a few seconds at most)."""
        with held():
            return self._ask(EndJob(next(self._requests), job, release), (), "stop a job's processes", JobEnded).left

    def close(self) -> None:
        """Stop the starter (it kills any rank still running): its channel closes, SIGHUP, `CLOSE_WAIT_S`, SIGKILL."""
        with contextlib.suppress(OSError):
            self.channel.sock.shutdown(socket.SHUT_RDWR)  # the starter sees the end; the reader wakes
        if self._owned:
            starter = Children()
            starter.adopt(self.pid, "the rank starter")
            starter.stop(signal.SIGHUP, CLOSE_WAIT_S, group=False)  # (SIGHUP: even while it imports, `Preload`)
        self.reader.join(CLOSE_WAIT_S)
        self.channel.close()


def import_torch_first() -> None:
    """Import torch now when it is a build without GPU support, before this process forks its starter, which then has
    it: one import, not two. A CUDA build stays unimported: only then is the starter a fork (`_can_fork_controller`)."""
    if "torch" not in sys.modules and _compat.torch_without_gpu_support():
        import torch  # noqa: F401


def _can_fork_controller() -> bool:
    """Whether this process can fork into a starter: no other thread (a fork copies held locks), no CUDA torch (once
    it counts GPUs, torch refuses CUDA in forked children, unseen from here)."""
    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and (torch is None or torch.version.cuda is None)


_starters: dict[bool, RankStarter] = {}
launched: set[int] = set()
"""The pids of the starters this process started (its children, each in a session of its own), closed ones too."""
_lasting: queue.SimpleQueue[tuple[Callable[[], tuple[Channel, int]], Future[tuple[Channel, int]]]] | None = None
_lasting_lock = threading.Lock()
_lasting_thread: threading.Thread | None = None


def _in_a_lasting_thread(launch: Callable[[], tuple[Channel, int]]) -> tuple[Channel, int]:
    """`launch()` in a thread that lasts as long as this process: the starter dies with the *thread* that started it
    (PR_SET_PDEATHSIG), as one from a thread pool or `asyncio.to_thread` would. Other than main, ask a daemon thread."""
    if threading.current_thread() is threading.main_thread():
        return launch()
    global _lasting, _lasting_thread
    with _lasting_lock:
        if _lasting is None:
            _lasting = queue.SimpleQueue()
            _lasting_thread = threading.Thread(target=_launch_when_asked, args=(_lasting,), name="ddpw-starter-parent",
                                               daemon=True)
            _lasting_thread.start()
    done: Future[tuple[Channel, int]] = Future()
    _lasting.put((launch, done))
    return done.result()


def _forget_starters() -> None:
    """In a fork: the starters are the parent's (and their threads not there), so the fork starts its own."""
    global _lasting, _lasting_thread
    _lasting = _lasting_thread = None
    _starters.clear()
    launched.clear()


os.register_at_fork(after_in_child=_forget_starters)


def starter_threads() -> set[threading.Thread]:
    """This process's threads that start and hear its starters (they last from one job to the next)."""
    threads = {starter.reader for starter in _starters.values()}
    return threads | {_lasting_thread} if _lasting_thread is not None else threads


def _launch_when_asked(
        requests: queue.SimpleQueue[tuple[Callable[[], tuple[Channel, int]], Future[tuple[Channel, int]]]]) -> None:
    """The lasting thread of `_in_a_lasting_thread`."""
    while True:
        launch, done = requests.get()
        try:
            done.set_result(launch())
        except BaseException as error:  # noqa: BLE001 - handed to the thread that asked
            done.set_exception(error)


def use_starter(starter: RankStarter) -> None:
    """Make `starter` this process's for every start method (a job process uses the starter that forked it)."""
    _starters[True] = _starters[False] = starter


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
    for starter in {id(starter): starter for starter in _starters.values()}.values():
        starter.close()
    _starters.clear()
