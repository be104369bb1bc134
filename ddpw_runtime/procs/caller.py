"""`Wrapper(caller_rank=True)` (docs/architecture.md): rank 0 in the calling process, which keeps what it builds.
Ctrl-C and SIGTERM to the caller reach every rank: the caller's task gets KeyboardInterrupt (or `Terminated`), the
other ranks the signal and `grace.interrupt_s` to finish."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from types import FrameType, TracebackType
from typing import Any

from ddpw_runtime import _compat
from ddpw_runtime.errors import JobTimedOut, RankFailure, RankStopped, Terminated
from ddpw_runtime.launch.engine import settle, with_restarts
from ddpw_runtime.launch.job import LocalJob, NodeJob, local_job
from ddpw_runtime.launch.outcome import note_failures
from ddpw_runtime.launch.payload import TaskCall, from_task
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.launch.signals import STOPPING_SIGNALS, handle, raised_for, signal_of
from ddpw_runtime.launch.stacks import RankPlace, from_frame
from ddpw_runtime.launch.supervisor import STOP_SIGNAL, NodeRanks, supervise
from ddpw_runtime.rank.own_process import ImportHold, RankInThisProcess, on_stack


def run_with_caller_rank(task: TaskCall, job: NodeJob) -> list[Any]:
    """`run_ranks` with rank 0 in this process (checked by `check_caller_rank`): every rank's value in rank order,
    rank 0's the object itself; the `RankFailure` of rank 0 has what its task raised here as its cause."""
    packed, state = task.pack(), ProcessState.capture()
    return with_restarts(job, lambda attempt: _run_once(task, packed, state, attempt))


def _run_once(task: TaskCall, packed: bytes, state: ProcessState, job: NodeJob) -> list[Any]:
    with local_job(packed, state, job, starts_ranks=job.platform.world_size > 1) as local:
        with CallerRank(local) as rank_zero:
            own = rank_zero.call(task)
            outcomes = rank_zero.finish()
        try:
            settle(job, outcomes)
        except RankFailure as failure:
            if failure.rank == 0 and rank_zero.own_error is not None and not rank_zero.stopped:
                failure.__cause__ = rank_zero.own_error  # the object itself, not a copy (not the stop's RankStopped)
            raise
        return [own, *(o.result.value() for o in outcomes[1:] if o.result is not None)]


class CallerRank:
    """Rank 0 of `local`'s job in this process, the node's other ranks around it. As a context manager: entering
    starts the other ranks, leaving with an exception stops them, and always puts the process back as it was."""

    def __init__(self, local: LocalJob) -> None:
        from ddpw_runtime.rank.environment import rank_environment

        self.local = local
        self.plan = local.plan
        env = {**rank_environment(self.plan, 0, 0, local.payload.state.env),
               **local.payload.job_environment(own_process=True)}
        self.rank = RankInThisProcess(self.plan, env)
        self.own_error: BaseException | None = None
        """What rank 0's task raised here (the object itself), when it raised."""
        self.own: RankResult | None = None
        self.stopped = False
        """Rank 0 was told to stop (another rank failed, or the time limit passed)."""
        self.interrupted: int | None = None
        """The signal (SIGINT, SIGTERM) passed on to the ranks when the caller got one."""
        self._console = local.console(skip=0)
        self._ranks = NodeRanks(local, self.plan.global_ranks[1:], self._console, self._stop_rank_zero,
                                own=self._where_rank_zero)
        self._others: list[RankOutcome] | BaseException = []
        self._thread = threading.Thread(target=self._supervise, name="ddpw-other-ranks", daemon=True)
        self._task_over = threading.Event()
        self._place_zero: RankPlace | None = None
        self._saved_handlers: dict[int, Any] = {}
        self._stoppable = {TaskCall.__call__.__code__, type(self.rank).enter.__code__}
        self._import_hold = ImportHold(self._send_stop)

    def __enter__(self) -> CallerRank:
        try:
            self.local.host_store()
            if self._ranks.ranks:  # (a job of one rank starts no process, and has no starter to ask)
                self._ranks.adopt_process(os.getpid())  # what rank 0 starts here ends with the job
            if threading.current_thread() is threading.main_thread():
                self._saved_handlers = {sig: signal.getsignal(sig) for sig in (STOP_SIGNAL, *STOPPING_SIGNALS)}
                signal.signal(STOP_SIGNAL, self._on_stop_signal)
                handle(STOPPING_SIGNALS, self._on_interrupt)
            self._console.__enter__()
            self._thread.start()
        except BaseException as exc:  # a Ctrl-C meanwhile: the caller's own handlers back, nothing left running
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            self._abort(exc)
        self._task_over.set()
        if self._thread.is_alive():
            self._ranks.request_stop()
            self._thread.join()
        self._console.stop()
        self.local.drop_store()
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    def call(self, task: TaskCall) -> Any:
        """Run `task` as rank 0 here; its value (the object itself), or None when it raised (its result says why).
        KeyboardInterrupt and other BaseExceptions propagate after the teardown."""
        own = RankResult(0)
        value = None
        try:
            self.rank.enter()
            if self.interrupted is not None:  # one that its joining dropped (`_on_interrupt`)
                raise raised_for(self.interrupted)
            value = task()
        except Exception as exc:
            from ddpw_runtime.rank.task_init import explained  # torch is loaded: the rank joined its job

            self.own_error = explained(from_task(exc))
            own = RankResult.failure(0, self.own_error)
        except BaseException as exc:
            own = RankResult.failure(0, exc)
            raise
        finally:
            self._task_over.set()
            self.rank.leave(own)
            self.own = own
        return value

    def finish(self) -> list[RankOutcome]:
        """After rank 0's task ended: stop the other ranks if rank 0 failed, wait for them, and tell how every rank
        ended (rank 0 first). Raises JobTimedOut when the job reached its time limit."""
        if self.own is None or not self.own.ok:
            self._ranks.request_stop()
        self._thread.join()
        if isinstance(self._others, JobTimedOut):
            raise with_rank_zero(self._others, self._place_zero)
        if isinstance(self._others, BaseException):
            raise self._others
        return [self._own_outcome(), *self._others]

    def _own_outcome(self) -> RankOutcome:
        own = self.own
        return RankOutcome(rank=0, node=0, result=None if self.stopped else own, exit_code=None, stopped=self.stopped,
                           ended_at=own.finished_at if own is not None else time.time(), place=self._place_zero)

    def _abort(self, exc: BaseException) -> None:
        """Rank 0 ended by `exc` (Ctrl-C, SIGTERM, `sys.exit`): stop the other ranks (the signal passed on, with the
        grace) and wait for them."""
        if self.interrupted is None:
            self._ranks.request_stop(signal_of(exc) if isinstance(exc, (KeyboardInterrupt, Terminated)) else None)
        if self._thread.ident is not None:  # started
            self._thread.join()
        if isinstance(self._others, list):
            note_failures([self._own_outcome(), *self._others])

    # ------------------------------------------------------------------ the supervising thread
    def _supervise(self) -> None:
        try:
            if self._ranks.ranks:
                self._others = supervise(self._ranks)
            elif not self._task_over.wait(self.plan.platform.timeout_min * 60.0):  # the caller's is the only rank
                self._stop_rank_zero()
                raise JobTimedOut(self.plan.platform.timeout_min, {})
        except BaseException as exc:  # handed to the caller's thread by finish()
            self._others = exc
            self._stop_rank_zero()
        while self.stopped and not self._task_over.wait(self.local.job.grace.stop_s):
            self._send_stop()

    def _stop_rank_zero(self) -> None:
        """The job is being stopped (another rank failed, or the time limit): stop rank 0 too, if its task runs."""
        self._console.freeze()
        self.local.drop_store()  # a rank 0 still joining fails at once
        if self._task_over.is_set() or self.stopped:
            return
        self.stopped = True
        self._place_zero = from_frame(0, _compat.main_thread_frame())
        self._send_stop()

    def _where_rank_zero(self) -> RankPlace | None:
        """Where rank 0's task is now (from the supervising thread); None once it is over."""
        return None if self._task_over.is_set() else from_frame(0, _compat.main_thread_frame())

    def _send_stop(self) -> None:
        if self._saved_handlers and not self._task_over.is_set():
            signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL)

    # ------------------------------------------------------------------ signal handlers (main thread)
    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if (self.stopped and not self._task_over.is_set() and on_stack(frame, self._stoppable)
                and not self._import_hold.holds(frame)):
            raise RankStopped()

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        again = self.interrupted is not None
        self.interrupted = signum
        self._ranks.request_stop(signum)  # again: the ranks are killed at once
        if not again:  # (code that rank 0's joining runs may drop it: an extension module's import, `call`)
            raise raised_for(signum)


def with_rank_zero(timed_out: JobTimedOut, place: RankPlace | None) -> JobTimedOut:
    """`timed_out` (the other ranks') with where rank 0, in this process, was."""
    if place is None:
        return timed_out
    # (the other ranks' report counted rank 0, not one of their processes, as ended; a stall's placed it already)
    report = None if timed_out.report is None else replace(
        timed_out.report, places=(place, *(p for p in timed_out.report.places if p.rank != place.rank)),
        ended=tuple(rank for rank in timed_out.report.ended if rank != place.rank))
    return JobTimedOut(timed_out.timeout_min, {0: place.where(), **timed_out.where}, report, timed_out.stalled)
