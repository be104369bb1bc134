"""Starts one node's ranks, waits for them, stops them all on the first failure, and tells how each ended
(`RankOutcome`). Every wait is bounded (docs/architecture.md, "One event source for supervision")."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from types import FrameType

from ddpw_runtime.errors import JobTimedOut, Terminated, TimeLimitNear
from ddpw_runtime.launch.bounds import KILL_WAIT_S, REPORT_S, STARTING_GRACE_S
from ddpw_runtime.launch.children import Child, Children, ChildState, StarterGone
from ddpw_runtime.launch.console import ConsoleRanks
from ddpw_runtime.launch.hangs import Watch, drop_stacks, report_of, take_places
from ddpw_runtime.launch.job import LocalJob
from ddpw_runtime.launch.job_processes import JobProcesses
from ddpw_runtime.launch.outcome import note_failures
from ddpw_runtime.launch.payload import read_pickled
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.launch.signals import (
    held,
    ignored,
    killed_line,
    raise_terminated,
    send_to_group,
    signal_of,
    sigterm_raises,
)
from ddpw_runtime.launch.stacks import RankPlace, shown_ranks

log = logging.getLogger(__name__)

STOP_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
"""Asks a rank 0 in the user's own process to stop: it raises `RankStopped` in its task, so Hydra reports the job."""


@dataclass(frozen=True)
class OutsideRank:
    """Rank 0 when this node did not start it (a plain run's: the user's own process). It is signalled alone (its
    process group is the terminal's), asked to stop with `STOP_SIGNAL`, and gets `REPORT_S` more grace. `reached(sig)`:
    the signal this process got reached it too (a terminal's Ctrl-C, a signal to the process group), so it is not
    passed on to it; `join`: asks it to join as the ranks start; `left`: it said its task ended (its process goes on,
    but it is no longer rank 0: it writes no stack)."""

    pid: int
    reached: Callable[[int], bool]
    join: Callable[[], None]
    left: Callable[[], bool]


class NodeRanks(Children):
    """`ranks` of `local`'s node and how to stop them, supervised by one thread (`supervise`; any may `request_stop`).
    `on_stop`: called as the job is being stopped; `outside`: rank 0, which this node did not start."""

    def __init__(self, local: LocalJob, ranks: Sequence[int], console: ConsoleRanks,
                 on_stop: Callable[[], None] = lambda: None, outside: OutsideRank | None = None,
                 own: Callable[[], RankPlace | None] | None = None) -> None:
        super().__init__()
        self.local = local
        self.key = str(local.workdir)
        self.outside = outside
        self.adopted: list[int] = []
        """Processes started elsewhere, the job's while it runs (`adopt_process`)."""
        self.ranks = list(ranks)
        self.console = console
        self.on_stop = on_stop
        self.rank_of: dict[int, int] = {}
        self.signals_sent: set[int] = set()
        self.places: dict[int, RankPlace] = {}
        """Where each running rank was as the job was stopped."""
        self.own = own
        """Where the rank that runs in this process is (a caller's rank 0), for a request's or a stall's report."""
        self.watch = Watch(local.plan, self.watched_places, local.job.console_prefix)
        self._requests: list[int | None] = []  # what other threads asked for (`request_stop`)
        self._lock = threading.Lock()

    def _started(self, rank: int, pid: int) -> None:
        self.rank_of[pid] = rank
        self.add(pid, f"rank {rank}", ChildState.STARTING)

    def start(self) -> None:
        """Start every rank."""
        first = self.local.plan.global_ranks[0]
        for rank in self.ranks:
            if self.outside is not None and rank == 0:
                continue
            with held():  # Ctrl-C or SIGTERM comes once the rank is known here, so that it is stopped too
                pid = self.local.starter.start(self.inbox, self.key, str(self.local.payload_path), rank - first,
                                               self.console.terminal_of(rank))
                self.console.handed_over(rank)
                self._started(rank, pid)
        if self.outside is not None:  # last: its move into the job's cgroup (`adopt_process`) overlaps their start
            self._started(0, self.outside.pid)
            self.adopt_process(self.outside.pid)
            self.outside.join()

    def adopt_process(self, pid: int) -> None:
        """Count `pid` (a rank 0 this node did not start) as the job's until `end`: what it starts ends with the job."""
        self.local.starter.adopt(self.key, pid)
        self.adopted.append(pid)

    def request_stop(self, sig: int | None = None) -> None:
        """Ask (from any thread) to stop the ranks: as after a failure, or passing on `sig` (SIGINT or SIGTERM)."""
        with self._lock:
            self._requests.append(sig)
        self.inbox.wake()  # nothing once supervision is over: there is nothing left to stop

    def starting(self) -> list[Child]:
        """The running ranks not in their task yet (`RankPayload.task_mark`)."""
        for rank in self.running():
            if rank.state is ChildState.STARTING and self.local.payload.task_mark(self.rank_of[rank.pid]).exists():
                rank.state = ChildState.RUNNING
        return [rank for rank in self.running() if rank.state is ChildState.STARTING]

    def send(self, sig: int, to: list[Child] | None = None, group: bool = True) -> None:
        """`Children.send`, noting `sig` as sent."""
        self.signals_sent.add(sig)
        super().send(sig, to, group)

    def signal(self, child: Child, sig: int, group: bool) -> None:
        """An outside rank gets a signal alone, and no Ctrl-C when the terminal's reaches it (`OutsideRank`). SIGTERM
        reaches a rank alone: the processes it started stop as the job ends (`end`), after it. Its DataLoader's workers,
        which SIGTERM kills, would otherwise die while its handler saves a checkpoint, and the DataLoader then raises
        there ('DataLoader worker ... is killed by signal: Terminated'), losing the checkpoint."""
        if self.outside is None or child.pid != self.outside.pid:
            send_to_group(child.pid, sig, group and sig != signal.SIGTERM)
        elif not self.outside.reached(sig):
            send_to_group(child.pid, sig, group=False)

    def take_places(self) -> dict[int, RankPlace]:
        """Where each running rank is now (its stacks, next to its log)."""
        outside = self.outside
        return take_places(self.local.plan, {self.rank_of[rank.pid]: rank.pid for rank in self.running()},
                           lambda rank: outside is not None and rank == 0 and outside.left())

    def watched_places(self) -> dict[int, RankPlace]:
        """`take_places`, and the rank in this process (`own`) where there is one: not a rank that had ended."""
        places = self.take_places()
        if self.own is not None and (place := self.own()) is not None:
            places[place.rank] = place
        return places

    def pass_on(self, sig: int, spare: int | None = None) -> None:
        """Pass `sig` (`signals.PASSED_ON`) on to every running rank but `spare`, each alone (its handler's, not its
        DataLoader's workers'). No stop: a rank it kills failed by itself, named with it."""
        for rank in self.running(spare):
            self.signal(rank, sig, group=False)

    def _begin_stop(self) -> float:
        """Freeze the console, take the ranks' stacks before any is stopped, send SIGTERM; when their grace ends."""
        self.console.freeze()
        self.places = self.take_places()
        self.on_stop()
        outside = self.outside.pid if self.outside is not None else None
        self.send(signal.SIGTERM, self.running(spare=outside))
        self.send(STOP_SIGNAL, [rank for rank in self.running() if rank.pid == outside])  # (see `OutsideRank`)
        return time.monotonic() + self.local.job.grace.stop_s

    def wait_for_ranks(self) -> bool:
        """Wait for every rank, stopping all on the first failure or request; whether the time limit stopped them."""
        grace_end = float("inf")
        limit_end = time.monotonic() + self.local.plan.platform.timeout_min * 60.0
        timed_out = reported = False
        while self.running():
            ended = self.next_exit(max(0.0, min(grace_end, limit_end, self.watch.due) - time.monotonic()))
            # A rank that exited without its result (`os._exit(0)` in its task) failed too: its peers would wait for it.
            failed = ended is not None and (ended.exit_code != 0 or
                                            not self.local.payload.result_file(self.rank_of[ended.pid]).exists())
            if (self._take_requests() or failed) and not self.stopping:
                grace_end = self._begin_stop()
            if time.monotonic() >= grace_end:  # an outside rank still in its task gets `REPORT_S` more (once)
                outside = self.outside.pid if self.outside else None
                in_task = {rank.pid for rank in self.running()} - {rank.pid for rank in self.starting()}
                spare = outside if not reported and outside in in_task else None
                reported, report_end = True, time.monotonic() + REPORT_S  # counted while the others' kill waits
                self.kill(spare=spare)
                grace_end = float("inf") if spare is None else report_end
            elif time.monotonic() >= limit_end or (not self.stopping and self.watch.check()):
                timed_out, limit_end = True, float("inf")
                grace_end = self._begin_stop()
        return timed_out

    def _take_requests(self) -> bool:
        """Act on other threads' requests; whether a stop was asked for."""
        with self._lock:
            requests, self._requests = self._requests, []
        signals = [sig for sig in requests if sig is not None]
        if signals:
            self.interrupt(signals[0])
        return bool(requests)

    def interrupt(self, sig: int) -> None:
        """Pass `sig` (SIGINT or SIGTERM) on to every rank, give them `grace.interrupt_s` (those still starting,
        `STARTING_GRACE_S`), then kill them; a second one kills at once (with `NodeJob.second_signal_kills`)."""
        self.send(sig)
        start, grace = time.monotonic(), self.local.job.grace.interrupt_s
        # a second Ctrl-C or SIGTERM (or a request): kill now
        with suppress(KeyboardInterrupt, Terminated), ignored(not self.local.job.second_signal_kills):
            self.wait(start + min(STARTING_GRACE_S, grace), until=lambda: bool(self._requests))
            still = self.starting()
            self.send(signal.SIGKILL, to=still)
            self.wait(start + grace, until=lambda: bool(self._requests))
        self.kill(again=time.monotonic() < start + grace)

    def kill(self, spare: int | None = None, group: bool = True, again: bool = False) -> list[Child]:
        """`Children.kill`, naming each rank in its task that a stop's signal reached (not one still joining); `again`:
        before the grace was over, as the signal came again."""
        outside = self.outside.pid if self.outside is not None else None
        starting = self.starting()
        for rank in self.running(spare):
            if rank.stopped and rank not in starting:
                sys.stderr.write(killed_line(rank.name, rank.pid, rank.pid == outside, again))
        return super().kill(spare, group)

    def outcomes(self) -> list[RankOutcome]:
        """How each rank ended, in rank order."""
        plan = self.local.plan
        of_rank = {self.rank_of[pid]: started for pid, started in self.of_pid.items()}
        outcomes = []
        for rank in self.ranks:
            child = of_rank.get(rank)  # None: it never started
            outcomes.append(RankOutcome(
                rank=rank, node=plan.node_rank, result=read_pickled(self.local.payload.result_file(rank), RankResult),
                exit_code=child.exit_code if child else None, stopped=child is not None and child.stopped,
                signals_sent=frozenset(self.signals_sent), log_file=str(plan.log_file(rank)),
                ended_at=(child.ended_at if child else None) or time.time(), place=self.places.get(rank),
                stopped_at=child.stopped_at if child else None))
        return outcomes

    @property
    def stopping(self) -> bool:
        """Whether the job is being stopped (a rank got a stop's signal)."""
        return any(rank.stopped for rank in self.of_pid.values())

    def end(self) -> None:
        """After the ranks ended: have the starter stop what they started (but ranks left behind, named already),
        drop empty stacks files. Whole (each step is bounded), so what the ranks started is never left running."""
        with held():
            drop_stacks(self.local.plan)
            stuck = [rank.pid for rank in self.of_pid.values() if rank.state is ChildState.LEFT_BEHIND]
            try:
                left = self.local.starter.end_job(self.key, (*self.adopted, *stuck))
            except StarterGone:  # its ranks died with it (SIGKILL at its death); what they started is stopped here
                for pid in self.of_pid:
                    if pid not in self.adopted:
                        send_to_group(pid, signal.SIGKILL)  # forks of a rank are in its process group
                job = JobProcesses(self.key, cgroup=False)  # and what names the job elsewhere
                job.spared.update(stuck)
                left = tuple(job.stop())
            except RuntimeError:  # the starter did not answer in time: it stops what it can when it ends
                return
        if left:
            log.error("processes the ranks started would not die %.0f s after SIGKILL (stuck in the kernel?); left "
                      "behind: pids %s", KILL_WAIT_S, ", ".join(map(str, left)))


_supervised: list[NodeRanks] = []
"""The ranks `supervise` supervises now in this process."""


def pass_on(sig: int) -> bool:
    """Pass `sig` (`signals.PASSED_ON`) on to the ranks supervised in this process (`NodeRanks.pass_on`); whether
    there were any."""
    for ranks in list(_supervised):
        ranks.pass_on(sig)
    return bool(_supervised)


def supervise(ranks: NodeRanks, on_sigterm: Callable[[int, FrameType | None], object] = raise_terminated
              ) -> list[RankOutcome]:
    """Start `ranks`, wait for them, tell how each ended; JobTimedOut past the time limit. Ctrl-C or SIGTERM here
    (through `on_sigterm`, which raises `Terminated`) is passed on to the ranks, then raised, unless every rank's task
    had returned; `TimeLimitNear` raised here (SLURM's warning) stops them as the time limit does, SIGTERM giving them
    their interrupt grace."""
    plan = ranks.local.plan
    warned = False
    with sigterm_raises(on_sigterm):
        _supervised.append(ranks)
        try:
            ranks.start()
            timed_out = ranks.wait_for_ranks()
        except (KeyboardInterrupt, Terminated) as stop:
            # Every rank's task had returned (the stop came as they exited: a tracker's upload in an atexit handler):
            # the job is done, its values kept (a sweep's `fail_fast` stops the jobs beside a failed one so).
            returned = all(o.result is not None and o.result.ok for o in ranks.outcomes())
            near = isinstance(stop, TimeLimitNear)
            warned = near and not ranks.stopping  # (a job being stopped for a failure ends with that failure)
            if warned:  # where each rank is, before any is stopped
                ranks.console.freeze()
                ranks.places = ranks.take_places()
            ranks.interrupt(signal_of(stop))
            outcomes = ranks.outcomes()
            if not near:  # (else as the time limit's, or the failure's, below)
                note_failures(outcomes)
            if returned and not any(o.failed for o in outcomes):
                warned = False
            elif not near:
                raise
            timed_out = warned
        except BaseException:
            ranks.kill()
            raise
        finally:
            _supervised.remove(ranks)
            ranks.end()
    if timed_out:
        outcomes = ranks.outcomes()
        note_failures(outcomes)
        stalled = ranks.watch.stalled if ranks.watch.stopped_job else None
        # A rank that failed before as another node's time limit stopped its peers: where it waited (its traceback).
        ended = {o.rank: place for o in outcomes if o.rank not in ranks.places and o.is_secondary
                 and (place := o.where()) is not None}
        why = ("SLURM's warning that the time limit was near" if warned else
               f"the time limit, platform.timeout_min={plan.platform.timeout_min:g}")
        report = stalled or report_of(plan, why, {**ended, **ranks.places})
        raise JobTimedOut(plan.platform.timeout_min, shown_ranks(report.places), report, stalled is not None, warned)
    outcomes = ranks.outcomes()
    ranks.local.starter.preload_modules(sorted({name for o in outcomes if o.result for name in o.result.imported}))
    return outcomes
