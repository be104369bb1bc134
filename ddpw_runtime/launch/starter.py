"""The controller's handle on its rank starter, the helper process that starts the ranks of every job and reports
their exits (`procs/starter.py`; docs/architecture.md, "Rank starter instead of `multiprocessing`"). Jobs side by side
share one starter: a reader thread hands each answer to the thread that asked, each exit to its job's `Inbox`."""

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
    """A handle on a starter process, callable from several threads (one per job that runs). `attached_to`: a
    channel to a starter that another process owns (a job process's); else this process starts its own."""

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
        self.reader = threading.Thread(target=self._read, name="ddpw-rank-starter", daemon=True)
        """The thread that hears the starter (`_read`)."""
        self.reader.start()

    def _launch(self) -> tuple[Channel, int]:
        ours, theirs = socket.socketpair()
        controller = os.getpid()
        if self.preload and _can_fork_controller():
            # A forked copy of this process has the user's imports (and torch, when loaded here) and skips an
            # interpreter's start-up. What the starter imports for every rank is imported here first when torch
            # is (a fork's imports are slower: each page Python touches is copied).
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
            # A session of its own: a Ctrl-C typed in the terminal (or a signal to the program's process group) would
            # reach it while it imports, before its own handlers are set (its traceback on the console); its
            # controller ends it (`close`, PDEATHSIG), as it does a forked one.
            self._process = subprocess.Popen([sys.executable, "-m", "ddpw_runtime.procs.starter", str(theirs.fileno()),
                                              "1" if self.preload else "0", str(controller)],
                                             pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            pid = self._process.pid
        theirs.close()
        return Channel(ours), pid

    def _read(self) -> None:
        """The reader thread: hand each message to whoever waits for it, until the channel closes."""
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
        """Send `request` and wait for its answer, at most `ANSWER_WAIT_S`; the exit of the process it
        starts goes to `inbox`."""
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

    def start(self, inbox: Inbox, job: str, payload_path: str, local_rank: int, listen_fd: int | None = None,
              terminal: int | None = None) -> int:
        """Start one rank of `job`, its exit to go to `inbox`, handing it `listen_fd` (the rendezvous socket) and
        `terminal` (where its output goes instead of its log file) if given; its pid. Call it with Ctrl-C and SIGTERM
        held (`signals.held`), and note the pid before letting them in: no rank may run unbeknown to the controller."""
        request = StartRank(next(self._requests), job, payload_path, local_rank, listen_fd is not None,
                            terminal is not None)
        fds = [fd for fd in (listen_fd, terminal) if fd is not None]
        return self._ask(request, fds, f"start rank {local_rank}", RankStarted, inbox).pid

    def start_job(self, inbox: Inbox, payload_path: str, run: Callable[[str, Channel, int, bool], int]) -> int:
        """Start a job process that calls `run` (see `StartJob`), whose exit will go to `inbox`; its pid."""
        request = StartJob(next(self._requests), payload_path, run)
        return self._ask(request, (), "start a job process", RankStarted, inbox).pid

    def adopt(self, job: str, pid: int) -> None:
        """Count `pid`, a process started elsewhere, as one of `job`'s (see `Adopt`); it does once this returns."""
        self._ask(Adopt(next(self._requests), job, pid), (), "count a process as the job's", RankStarted)

    def preload_modules(self, modules: Sequence[str]) -> None:
        """Have the starter import `modules` (for the ranks it starts from now on)."""
        if modules and self.preload:
            self._send(Preload(tuple(modules)))

    def _send(self, message: object) -> None:
        """Send a message that has no answer (a starter that is gone is seen by the next request)."""
        with self._send_lock, contextlib.suppress(OSError):
            self.channel.send(message)

    def end_job(self, job: str, release: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Stop every process the ranks of `job` started, but those in `release`; the pids that would not
        die. Ctrl-C and SIGTERM wait until the answer is in (at most a few seconds: see `job_processes.py`)."""
        with held():
            return self._ask(EndJob(next(self._requests), job, release), (), "stop a job's processes", JobEnded).left

    def close(self) -> None:
        """Stop the starter (it kills any rank still running): it sees its channel close and gets SIGHUP, then
        `CLOSE_WAIT_S` to exit, then SIGKILL (`Children.stop`)."""
        with contextlib.suppress(OSError):
            self.channel.sock.shutdown(socket.SHUT_RDWR)  # the starter sees the end; the reader wakes
        if self._owned:
            starter = Children()
            starter.adopt(self.pid, "the rank starter")
            starter.stop(signal.SIGHUP, CLOSE_WAIT_S, group=False)  # (SIGHUP: even while it imports, `Preload`)
        self.reader.join(CLOSE_WAIT_S)
        self.channel.close()


def _can_fork_controller() -> bool:
    """Whether this process can be forked into a starter: no Python thread but this one (a fork can copy a held lock),
    and torch not imported yet or a build without CUDA (with CUDA, counting GPUs makes torch refuse CUDA in forked
    children, which cannot be seen from here)."""
    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and (torch is None or torch.version.cuda is None)


_starters: dict[bool, RankStarter] = {}
_lasting: queue.SimpleQueue[tuple[Callable[[], tuple[Channel, int]], Future[tuple[Channel, int]]]] | None = None
"""What the thread that starts the starters off the main thread is asked to do (`_in_a_lasting_thread`)."""
_lasting_lock = threading.Lock()
_lasting_thread: threading.Thread | None = None


def _in_a_lasting_thread(launch: Callable[[], tuple[Channel, int]]) -> tuple[Channel, int]:
    """`launch()` in a thread that lasts as long as this process: the starter dies with the *thread* that started it
    (the kernel sends PR_SET_PDEATHSIG as that thread ends), so one started by a thread that then ends (a `Wrapper`
    called from a thread pool, or `asyncio.to_thread`) would be gone at the next call. The main thread lasts; any
    other asks a daemon thread of this module's, which waits for such requests until the process ends."""
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
    """In a fork of this process: its starters and their threads are not there (a fork has only the thread that
    forked, and the starters are this process's to stop), so the fork starts its own when it needs one."""
    global _lasting, _lasting_thread
    _lasting = _lasting_thread = None
    _starters.clear()


os.register_at_fork(after_in_child=_forget_starters)


def starter_threads() -> set[threading.Thread]:
    """This process's threads that start and hear its starters: they last from one job to the next."""
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
    """Make `starter` the one this process asks for ranks, whatever their start method (a job process uses
    the starter that forked it)."""
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
