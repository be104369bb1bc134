"""The caller as rank 0: ranks 1..N-1 start as processes of their own, rank 0 runs in the calling
process, so what it builds (a trained model) stays in the caller's memory, and it keeps the caller's
terminal. `Wrapper(caller_rank=True)` and a plain Hydra run (the user's own process is rank 0) run so.

Rank 0 goes through the same `setup_rank` / `teardown_rank` as every other rank, with the rank's
variables set in `os.environ` only while it runs; afterwards the process group is gone, the caller's
environment, signal handlers and thread count are back as they were, and the next job can start.

While rank 0 runs, a thread supervises the other ranks. When one of them fails, or the job reaches its
time limit, rank 0 is stopped too: `RankStopped` is raised in the caller's main thread (by a signal, so
a blocking call returns), but only while the task is on its stack, and again every `grace.stop_s` until
the task has returned. Ctrl-C and SIGTERM to the caller reach every rank: the caller's task gets
KeyboardInterrupt (or `Terminated`), the other ranks the signal and `grace.interrupt_s` to finish.

The caller hosts the job's TCPStore, as torchrun's agent does, rather than rank 0's
`init_process_group`: when another rank fails before joining, closing the store makes rank 0's wait
fail at once instead of after the collective timeout.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import CodeType, FrameType, TracebackType
from typing import Any

from ddpw_conf import ConfigError, Platform
from ddpw_runtime.errors import JobTimedOut, RankStopped, Terminated
from ddpw_runtime.launch.engine import LocalJob
from ddpw_runtime.launch.job_processes import JobProcesses
from ddpw_runtime.launch.outcome import RankOutcome, note_failures
from ddpw_runtime.launch.payload import JOB_ENV, TaskCall, from_task
from ddpw_runtime.launch.records import RaisedError, RankResult, qualified_name
from ddpw_runtime.launch.stacks import where_in
from ddpw_runtime.launch.supervisor import supervise

log = logging.getLogger("ddpw")

STOP_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
"""The signal that raises `RankStopped` in the caller's main thread (a real-time signal no library
uses, where there are such signals)."""


def check_caller_rank(platform: Platform) -> None:
    """Raise ConfigError when the caller cannot be rank 0 of `platform`."""
    if platform.n_nodes != 1:
        raise ConfigError(
            "platform.n_nodes", platform.n_nodes, "rank 0 runs in this process (a plain run, or "
            "Wrapper(caller_rank=True)), so the job must run on this machine: use n_nodes=1",
        )
    if platform.ipc_protocol != "tcp":
        raise ConfigError(
            "platform.ipc_protocol", platform.ipc_protocol, "rank 0 runs in this process (a plain run, or "
            "Wrapper(caller_rank=True)), which hosts the rendezvous store; that needs the tcp rendezvous: use "
            "ipc_protocol=tcp (or start a multirun with -m, or caller_rank=False)",
        )


class CallerRank:
    """Rank 0 of `local`'s job in this process, the node's other ranks around it (see the module
    docstring). As a context manager: entering starts the other ranks, leaving with an exception
    stops them, and always puts the process back as it was.

    `task_code`: the code of the function that runs the task here; `RankStopped` is raised only while
    a frame of it (or of `enter_rank`) is on the main thread's stack. `on_stop`: called when the job is
    being stopped, before any rank gets a signal (the console stops echoing there). `log_file`: rank 0's
    log, if it has one. `interrupt`: what Ctrl-C raises in the caller's task (a KeyboardInterrupt).
    """

    def __init__(
        self,
        local: LocalJob,
        task_code: CodeType | None = None,
        on_stop: Callable[[], None] = lambda: None,
        log_file: str | None = None,
        interrupt: type[BaseException] = KeyboardInterrupt,
    ) -> None:
        self.local = local
        self.interrupt = interrupt
        self.log_file = log_file
        """Where rank 0's output goes besides the console, if anywhere."""
        self.plan = local.plan
        self.task_code = task_code or TaskCall.__call__.__code__
        self._stoppable = {self.task_code, CallerRank.enter_rank.__code__}
        """Code of the frames inside which `RankStopped` may be raised: joining the job, and the task."""
        self.on_stop = on_stop
        self.own: RankResult | None = None
        self.own_error: BaseException | None = None
        """What rank 0's task raised here (the object itself), when it raised."""
        self.stopped = False
        """Rank 0 was told to stop (another rank failed, or the time limit passed)."""
        self._store: Any = None
        self._console = local.console(skip=0)
        self._ranks = local.ranks(self.plan.global_ranks[1:], self._console, on_stop=self._stop_everything)
        self._others: list[RankOutcome] | BaseException = []
        self._thread = threading.Thread(target=self._supervise, name="ddpw-other-ranks", daemon=True)
        self._task_over = threading.Event()
        self._where_zero = ""
        self._saved_env: dict[str, str | None] = {}
        self._saved_handlers: dict[int, Any] = {}
        self._saved_threads: int | None = None
        self._saved_excepthook = sys.excepthook
        self._in_rank = False
        self.interrupted: int | None = None
        """The signal (SIGINT, SIGTERM) passed on to the ranks when the caller got one."""
        self._interrupted_at = ""

    # ------------------------------------------------------------------ the job around rank 0
    def __enter__(self) -> CallerRank:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            self.abort(exc)
        self.close()

    def start(self) -> None:
        """Host the store, start the other ranks (on the supervising thread), take on rank 0's variables
        and the signal handlers."""
        self._store = _host_store(self.local)
        from ddpw_runtime.rank.environment import rank_environment

        # JOB_ENV names the job in what rank 0's task starts too, so that it ends with the job (`close`).
        variables = {**rank_environment(self.plan, 0, 0), "TORCHELASTIC_USE_AGENT_STORE": "True",
                     JOB_ENV: self.local.payload.result_dir}
        self._saved_env = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in ((STOP_SIGNAL, self._on_stop_signal), (signal.SIGINT, self._on_interrupt),
                                 (signal.SIGTERM, self._on_interrupt)):
                self._saved_handlers[sig] = signal.signal(sig, handler)
        self._console.__enter__()
        self._thread.start()

    def enter_rank(self) -> None:
        """Make this process rank 0: device, process group, groups, seed (see `setup_rank`)."""
        import torch

        from ddpw_runtime.rank.environment import tell_imported_libraries
        from ddpw_runtime.rank.setup import setup_rank

        self._saved_threads = torch.get_num_threads()
        self._saved_excepthook = sys.excepthook
        self._in_rank = True
        tell_imported_libraries(0)
        setup_rank(self.plan, 0, 0)

    def leave_rank(self, own: RankResult) -> None:
        """Rank 0's task ended as `own`: leave the process group and put the process back (thread count,
        the `[rank0]` excepthook that init_process_group installs)."""
        import torch

        from ddpw_runtime.rank.setup import teardown_rank

        self._task_over.set()
        self.own = own
        if self._in_rank:
            self._in_rank = False
            teardown_rank()
            if self._saved_threads is not None:
                torch.set_num_threads(self._saved_threads)
            sys.excepthook = self._saved_excepthook

    def call(self, task: TaskCall) -> Any:
        """Run `task` as rank 0 here; its value (the object itself), or None when it raised (its result
        says why). KeyboardInterrupt and other BaseExceptions propagate after the teardown."""
        own = RankResult(0)
        value = None
        try:
            self.enter_rank()
            value = task()
        except Exception as exc:
            self.own_error = from_task(exc)
            own = RankResult.failure(0, self.own_error)
        except BaseException as exc:
            own = RankResult.failure(0, exc)
            raise
        finally:
            self.leave_rank(own)
        return value

    def finish(self) -> list[RankOutcome]:
        """After rank 0's task ended: stop the other ranks if rank 0 failed, wait for them, and tell how
        every rank ended (rank 0 first). Raises JobTimedOut when the job reached its time limit."""
        own = self.own
        if own is None or not own.ok:
            self._ranks.request_stop()
        self._thread.join()
        if isinstance(self._others, JobTimedOut):
            where = {0: self._where_zero, **self._others.where}
            raise JobTimedOut(self._others.timeout_min, where)
        if isinstance(self._others, BaseException):
            raise self._others
        return [self._own_outcome(), *self._others]

    def _own_outcome(self) -> RankOutcome:
        own = self.own
        stopped_here = own is not None and own.error is not None and own.error.type_name == _STOPPED_NAME
        return RankOutcome(
            rank=0,
            node=0,
            result=None if stopped_here else own,
            exit_code=None,
            stopped=self.stopped,
            ended_at=own.finished_at if own is not None else time.time(),
            log_file=self.log_file,
        )

    def abort(self, exc: BaseException) -> None:
        """Rank 0 ended by `exc` (not an Exception: Ctrl-C, SIGTERM, `sys.exit`): stop the other ranks
        (passing the signal on, with the grace) and wait for them."""
        if self.own is None:
            self.leave_rank(self._ended_by(exc))
        if self.interrupted is not None:
            pass  # the signal handler has passed Ctrl-C or SIGTERM on already
        elif isinstance(exc, KeyboardInterrupt):
            self._ranks.request_interrupt(signal.SIGINT)
        elif isinstance(exc, Terminated):
            self._ranks.request_interrupt(signal.SIGTERM)
        else:
            self._ranks.request_stop()
        self._thread.join()
        if isinstance(self._others, list):
            note_failures([self._own_outcome(), *self._others])

    def _ended_by(self, exc: BaseException) -> RankResult:
        """Rank 0's result when its task ended by `exc`, which did not return here: a signal's
        exception carries the stack where the signal came (the only trace of it left)."""
        if self.interrupted is None:
            return RankResult.failure(0, exc)
        name = "KeyboardInterrupt" if self.interrupted == signal.SIGINT else qualified_name(Terminated)
        stack = f"Traceback (most recent call last):\n{self._interrupted_at}{name}\n"
        return RankResult(0, error=RaisedError(name, "", stack))

    def close(self) -> None:
        """Stop what rank 0's task started (see `job_processes.py`), put the process back as it was
        (environment, signal handlers) and stop hosting the store."""
        self._task_over.set()
        if self._thread.is_alive():
            self._ranks.request_stop()
            self._thread.join()
        if self._saved_env:
            mine = JobProcesses(self.local.payload.result_dir, cgroup=False, spared=frozenset({self.local.starter.pid}))
            left = mine.stop()
            if left:
                log.error("processes rank 0 started would not die; left behind: pids %s", ", ".join(map(str, left)))
        self._console.stop()
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        self._store = None

    # ------------------------------------------------------------------ the supervising thread
    def _supervise(self) -> None:
        try:
            if self._ranks.ranks:
                self._others = supervise(self._ranks)
            else:
                self._ranks.close()
                self._others = self._wait_alone()
        except BaseException as exc:  # handed to the caller's thread by finish()
            self._others = exc
            self._stop_everything()
        if self.stopped:
            self._keep_stopping_rank_zero()

    def _wait_alone(self) -> list[RankOutcome]:
        """A job whose only rank is the caller's: wait for its task, at most until the time limit."""
        limit_s = self.plan.platform.timeout_min * 60.0
        if self._task_over.wait(limit_s):
            return []
        self._stop_everything()
        raise JobTimedOut(self.plan.platform.timeout_min, {})

    def _stop_everything(self) -> None:
        """The job is being stopped (another rank failed, or the time limit): stop echoing, stop hosting
        the store (a rank 0 still joining fails at once), and stop rank 0 here if its task still runs."""
        self.on_stop()
        self._console.freeze()
        self._store = None
        if self._task_over.is_set() or self.stopped:
            return
        self.stopped = True
        main = sys._current_frames().get(threading.main_thread().ident or 0)
        self._where_zero = where_in(main)
        if self.log_file is not None:  # where rank 0 was, in its log, as every stopped rank's
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self._send_stop()

    def _keep_stopping_rank_zero(self) -> None:
        while not self._task_over.wait(self.local.job.grace.stop_s):
            self._send_stop()

    def _send_stop(self) -> None:
        if self._saved_handlers and not self._task_over.is_set():
            signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL)

    # ------------------------------------------------------------------ signal handlers (main thread)
    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopped and not self._task_over.is_set() and _on_stack(frame, self._stoppable):
            raise RankStopped(
                "another rank failed or the job reached its time limit; this rank was stopped (the job's "
                "error names the cause)"
            )

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        again = self.interrupted is not None
        if not again:
            self.interrupted = signum
            self._interrupted_at = "".join(traceback.format_stack(frame))
        self._ranks.request_interrupt(signum)  # again: the ranks are killed at once
        if signum == signal.SIGTERM:
            if not again:
                raise Terminated()
        else:
            raise self.interrupt


_STOPPED_NAME = f"{RankStopped.__module__}.{RankStopped.__qualname__}"


def _on_stack(frame: FrameType | None, codes: set[CodeType]) -> bool:
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _host_store(local: LocalJob) -> Any:
    """The job's TCPStore server, held by the caller until dropped; it serves on a duplicate of the
    engine's rendezvous socket (the store closes its socket when it stops, the engine the original)."""
    from torch.distributed import TCPStore

    assert local.listen_fd is not None  # node 0 with the tcp rendezvous (check_caller_rank)
    own_fd = os.dup(local.listen_fd)
    try:
        return TCPStore(
            local.plan.master_addr,
            local.plan.master_port,
            local.plan.world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(minutes=local.plan.platform.collective_timeout_min),
            master_listen_fd=own_fd,
        )
    except BaseException:
        os.close(own_fd)
        raise
