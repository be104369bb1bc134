"""A plain run's supervisor: the program's own process, once its fork goes on as rank 0 (docs/architecture.md, "A
plain run is Hydra's own run mode"). The program exits with rank 0's exit code (also when its own exit, `sys.exit(n)`
in its task, failed the job), 130/143 after Ctrl-C/SIGTERM, or 1 when rank 0 was killed (the supervisor then shows the
job's error itself)."""

from __future__ import annotations

import gc
import os
import pickle
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import NoReturn

from ddpw_conf import Platform
from ddpw_conf.errors import CompactError
from ddpw_conf.launcher import LauncherOptions
from ddpw_runtime import _compat
from ddpw_runtime.errors import RankFailure, Terminated
from ddpw_runtime.launch import signals
from ddpw_runtime.launch.bounds import KILL_WAIT_S, TERM_WAIT_S, WAIT_SLICE_S
from ddpw_runtime.launch.children import Children, wait_for_exit
from ddpw_runtime.launch.console import PipeCopy, TerminalCopy, copied_output
from ddpw_runtime.launch.engine import settle, with_restarts
from ddpw_runtime.launch.job import Grace, NodeJob, local_job, starter_for
from ddpw_runtime.launch.job_processes import children_of_this_process
from ddpw_runtime.launch.payload import write_atomically
from ddpw_runtime.launch.protocol import (
    Channel,
    ExitBegan,
    JobSettled,
    JobStarting,
    RankExited,
    RankZero,
    RunEnded,
    TaskEnded,
)
from ddpw_runtime.launch.records import RankResult, portable_pickle
from ddpw_runtime.launch.signals import blocked, handle, held, raised_for, send_to_group, signal_of
from ddpw_runtime.launch.starter import close_starters, launched, starter_threads
from ddpw_runtime.launch.supervisor import NodeRanks, OutsideRank, supervise
from ddpw_runtime.nodes.controller import Nodes
from ddpw_runtime.procs.starter import adopt_orphans, die_with_parent

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HELD = (*_SIGNALS, *signals.PASSED_ON)
"""Held across the fork, and handled in the supervisor from then on."""


class ThreadsBeforeTheRun(CompactError, RuntimeError):
    """The program has threads besides its main one when a plain run would fork (the fork, rank 0, lacks them); the
    message names them and what to do, so Hydra prints it alone, without a traceback."""


def fork_supervisor(platform: Platform, options: LauncherOptions) -> Channel:
    """Fork the program: the child goes on as rank 0 (its channel to the supervisor returned); the parent supervises
    the job and exits, never returning."""
    own = {threading.current_thread(), *starter_threads()}  # (a fork starts starters of its own)
    others = [thread.name for thread in threading.enumerate() if thread not in own]
    if others:
        fix = ("in a notebook, whose kernel runs them, run a multirun (hydra-zen: `launch(..., multirun=True)`) or "
               "call `ddpw_runtime.Wrapper`" if "ipykernel" in sys.modules else
               "start them inside the task, or run with -m")
        raise ThreadsBeforeTheRun(f"a plain run with a ddpw launcher goes on in a fork of this process (the program's "
                                  f"own process supervises the job), and the thread(s) {', '.join(others)} started "
                                  f"before the run would not be there; {fix}")
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    gc.freeze()  # neither process's garbage collector copies what the program holds (~0.3 s with torch loaded)
    with blocked(_HELD) as before:  # none is handled half-way through the fork
        # One pending from before the fork would be this process's alone (a fork starts with none pending): it is
        # handled here first, as without hydra-ddpw (Ctrl-C raises KeyboardInterrupt).
        while set(_HELD) & signal.sigpending():
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
            signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        with warnings.catch_warnings():  # Python 3.12+ warns of a fork beside threads: the starters' (see above)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            ours.close()
            die_with_parent(signal.SIGKILL)
            if os.getppid() != parent:  # the supervisor died before that took effect
                os._exit(1)
            return Channel(theirs)
        theirs.close()
        adopt_orphans()  # what rank 0 forks and leaves running comes here (`RunSupervisor._stop_what_rank_zero_left`)
        code = 1
        try:
            code = RunSupervisor(Channel(ours), pid, platform, options, before).run()
        except BaseException:  # noqa: BLE001 - the supervisor must end, and say why
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


class _Hangup(BaseException):
    """The terminal went away (SIGHUP): every process of the job ends at once."""


class RunSupervisor:
    """The supervisor of one plain run: `channel` to rank 0's process `pid`."""

    def __init__(self, channel: Channel, pid: int, platform: Platform, options: LauncherOptions,
                 signal_mask: set[int | signal.Signals]) -> None:
        self.channel = channel
        self.pid = pid
        self.platform = platform
        self.options = options
        self.grace = Grace(options.stop_grace_s, options.interrupt_grace_s)
        self.signal_mask = signal_mask
        self.events: queue.SimpleQueue[JobStarting | RunEnded | TaskEnded | None] = queue.SimpleQueue()
        """What rank 0's process said; None once it ended (`exited`)."""
        self._watcher: threading.Thread | None = None
        self.result_file: Path | None = None
        self.log_file: Path | None = None
        """Rank 0's log, once its job has started."""
        self.output_copies: list[TerminalCopy | PipeCopy] = []
        """From the job's end: rank 0's fds 1 and 2, copied to this process's own and to rank 0's log."""
        self.exit_began: float | None = None
        """When rank 0's process began to exit while its task ran (`ExitBegan`)."""
        self.ranks: NodeRanks | None = None
        """The running attempt's ranks (a second Ctrl-C or SIGTERM kills them at once; its inbox gets rank 0's end)."""
        self.task_ended = threading.Event()
        """Rank 0 reported its task's end (in this attempt)."""
        self.awaiting = threading.Event()
        """Rank 0's process waits for an answer (`RankZero` or `JobSettled`)."""
        self.exited: int | None = None
        self.rank_zero = Children()
        """Rank 0's process as a child: `_watch` puts its end in this inbox too, to bound its kill."""
        self.rank_zero.add(pid, "rank 0 (the program's task)")
        self.job_started = False
        self.job_over = False
        """The run's job has ended: a signal from now on is the program's to handle (Hydra's end, or what it does
        after its run), and the exit code is the program's."""
        self.interrupted: int | None = None
        self.received: list[int] = []
        """The signals this process got (Ctrl-C, SIGTERM): a second one ends everything at once."""
        self.witness = _GroupWitness()
        self.sees_ctrl_c = _in_foreground()
        self.own_children = children_of_this_process()
        """Rank 0's process and what the program started before the run (never stopped here)."""
        self.rank_pids: set[int] = set()
        """Every rank this process started, in every attempt."""
        self.before_job: set[int] = set()
        """What rank 0's process had started as its job started (not the job's)."""

    # ------------------------------------------------------------------ the whole run
    def run(self) -> int:
        """Supervise the run until rank 0's process ends; the program's exit code."""
        handle(_SIGNALS, self._on_signal)  # (rank 0 ignores what this ignores; the others have groups of their own)
        signals.handle_passed_on(self._pass_on)  # (not in the rank starter, forked next, nor in its ranks)
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.signal_mask)  # what came since the fork is handled here
            # The starter first, while this process has no other thread: it is then a fork of this one (torch
            # loaded, in a CPU build), not a fresh interpreter that imports torch again.
            starter_for(self.platform)
            self._watching()
            first = self._next_event()
            if isinstance(first, JobStarting):
                self.before_job = _descendants(self.pid)
                return self._after_job(self._job(first))
            return self._end_of_run()
        except (KeyboardInterrupt, Terminated) as stop:
            return self._interrupt_rank_zero(signal_of(stop))
        except _Hangup:
            self._kill_rank_zero()
            return 128 + signal.SIGHUP
        finally:
            close_starters()
            self.witness.close()
            self._stop_what_rank_zero_left()
            for copy in dict.fromkeys(self.output_copies):  # what rank 0 wrote last reaches the console and its log
                copy.stop()

    def _job(self, starting: JobStarting) -> BaseException | None:
        """Run the job whose rank 0 is starting; its failure, or None when every rank returned. KeyboardInterrupt or
        Terminated when it was interrupted (every rank ended by then)."""
        from ddpw_runtime.hydra_jobs.summary import JobConsole
        from ddpw_runtime.procs.rank import configure_logging

        if starting.state.hydra_state is not None:  # log as the job does (the job log too), as a job process does
            _compat.restore_hydra_state(pickle.loads(starting.state.hydra_state))
            configure_logging(0)
        log_dir = Path(starting.log_dir)
        console = JobConsole(0, self.platform, log_dir, Path.cwd())
        job = NodeJob(self.platform, log_dir, self.grace, max_restarts=self.options.max_restarts)
        try:
            with console.shown():
                self.job_started = True
                # (not once rank 0's process, the program's run, has ended: it died, or its task called sys.exit)
                with_restarts(job, lambda attempt: self._attempt(starting, attempt), lambda: self.exited is None,
                              console.attempt)
        except Exception as failure:  # noqa: BLE001 - any failure is the job's, shown where it can be
            return failure
        return None

    def _attempt(self, starting: JobStarting, job: NodeJob) -> None:
        """One attempt of the job: rank 0 told to join, the other ranks started, every rank supervised."""
        if job.restart_count:
            self.task_ended.clear()
            with held():
                self._answer(JobSettled(None, restart=True))
                self.awaiting.set()  # rank 0 waits for the next `RankZero` now
        from ddpw_runtime.rank.environment import rank_environment

        with local_job(starting.task, starting.state, job) as local, local.console() as console:
            self.result_file = local.payload.result_file(0)
            self.log_file = local.plan.log_file(0)
            env = {**rank_environment(local.plan, 0, 0, local.payload.state.env),
                   **local.payload.job_environment(own_process=True)}
            terminal = console.terminal_of(0)
            nodes = Nodes.lead(local.host_store(), local, starting)  # a job across machines: the other nodes join
            rank_zero = RankZero(local.plan, env, terminal is not None, str(local.payload.task_mark(0)))

            def join() -> None:  # as the ranks start (`NodeRanks.start`)
                with held():  # told to join, and no longer counted as waiting for an answer: both or neither
                    self.awaiting.clear()
                    self.channel.send(rank_zero, [terminal] if terminal else [])
                console.handed_over(0)

            outside = OutsideRank(self.pid, self._reached_rank_zero, join, self.task_ended.is_set)
            ranks = self.ranks = nodes.ranks(local, console, local.drop_store, outside)
            if self.exited is not None:  # rank 0 died while the job was being prepared
                ranks.inbox.put(RankExited(self.pid, self.exited))
            try:
                with nodes.watching(ranks):
                    outcomes = supervise(ranks, on_sigterm=self._on_signal)  # says so, as for Ctrl-C
            except (KeyboardInterrupt, Terminated) as stop:
                self.interrupted = signal_of(stop)
                raise
            finally:
                self.ranks = None
                self.rank_pids.update(ranks.of_pid)
            if self.task_ended.is_set():  # rank 0's process goes on: its exit code is not its task's
                outcomes[0].exit_code = None
            settle(job, nodes.gathered(outcomes))

    # ------------------------------------------------------------------ after the job
    def _after_job(self, failure: BaseException | None) -> int:
        """Tell rank 0 how the job ended (when it waits to hear it), then wait for its process to end."""
        self.job_over = True
        if self.awaiting.is_set() and self.exited is None:  # rank 0's Hydra run shows its own error itself
            own = isinstance(failure, RankFailure) and failure.rank == 0 and bool(failure.traceback_text) \
                and failure.hang is None  # (a hang named on rank 0, its timeout the cause: the report is the error)
            self._stop_what_rank_zero_started()  # while it waits: not what the program starts after its run
            self._answer(JobSettled(None if own or failure is None else _pickled(failure)))
            with held():  # the run's one job is over: the starter exits while rank 0 finishes the run (a signal
                close_starters()  # meanwhile is handled right after, not lost in the starter's bounded stop)
            return self._end_of_run()
        if failure is not None:  # rank 0 cannot say it (it died or was killed): say it here
            sys.stderr.write(f"Error executing job: {failure}\n")
        own = isinstance(failure, RankFailure) and failure.rank == 0 and (self.exited or 0) > 0  # its `sys.exit(n)`
        self._kill_rank_zero()
        return 1 if failure is not None and not own else _exit_code(self.exited or 0)

    def _answer(self, settled: JobSettled) -> None:
        fds = [] if settled.restart else self._output_after_the_job()
        with held(), suppress(OSError):  # answered and no longer waiting, or neither (OSError: it is gone)
            self.awaiting.clear()
            self.channel.send(settled, fds)
        for copy in self.output_copies:
            copy.handed_over()

    def _output_after_the_job(self) -> list[int]:
        """What rank 0's fds 1 and 2 write into once its job is over, until its process ends (the program's output:
        its exit handlers', Hydra's error report, what the program does after its run): copied to this process's own
        and to rank 0's log, as every other rank's output goes to its log until it ends. Made once; none (rank 0 keeps
        its own) before the job has a log, or when this process has no output to copy to."""
        if self.output_copies or self.log_file is None:
            return []
        with suppress(OSError):
            self.output_copies = copied_output(self.log_file)
        return [copy.writer for copy in self.output_copies]

    def _end_of_run(self) -> int:
        """Wait for rank 0's process to end (Hydra finishing the run); its exit code."""
        while self.exited is None:
            event = self._next_event()
            if isinstance(event, RunEnded) and event.threads:
                sys.stderr.write(f"[ddpw] every rank has ended; the program keeps running because the task left non-"
                                 f"daemon thread(s) running: {', '.join(event.threads)} (as Python waits for them)\n")
        return _exit_code(self.exited)

    def _on_signal(self, signum: int, frame: FrameType | None) -> NoReturn:
        """Ctrl-C raises KeyboardInterrupt, SIGTERM `Terminated` (handled where the supervisor is: passed on to the
        ranks with the grace, or, the second time, at once); SIGHUP ends everything."""
        self.received.append(signum)
        if signum == signal.SIGHUP:
            raise _Hangup()
        if len(self.received) > 1:  # at once, wherever this one lands (even inside the first one's handling)
            if self.ranks is not None:
                self.ranks.send(signal.SIGKILL)
            send_to_group(self.pid, signal.SIGKILL, group=False)
        else:  # os.write: this may interrupt a write to sys.stderr
            what = signals.named(signum, short=True)
            who, them = ("the program (its job is over) gets it", "it") if self.job_over else ("every rank gets it",
                                                                                                 "them")
            os.write(2, f"[ddpw] {what}: {who} and {self.grace.interrupt_s:g} s to end; {what} again ends {them} at "
                        "once\n".encode())
        raise raised_for(signum)

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1 or SIGUSR2 (`signals.PASSED_ON`): to every rank of the running job, and to rank 0's process (the
        program's task) also outside it; once: not where it reached rank 0 already (a signal to the process group)."""
        ranks = self.ranks
        if ranks is not None:
            ranks.pass_on(signum, spare=self.pid)
        if self.exited is None and not self._reached_rank_zero(signum, again=True):
            send_to_group(self.pid, signum, group=False)

    # ------------------------------------------------------------------ interruptions outside the job
    def _interrupt_rank_zero(self, sig: int) -> int:
        """Ctrl-C or SIGTERM (`sig`): make sure every rank has it (a running job's had it passed on already), give rank
        0's process the grace to end, then kill it; exit 128 + sig (once the job is over, rank 0's own exit code when it
        ended within the grace). Rank 0 waiting in hydra-ddpw's code meanwhile is told the job was stopped, and ends."""
        sig = self.interrupted or sig
        with suppress(KeyboardInterrupt, Terminated):  # asked again: at once (`_on_signal` killed it)
            if self.job_started and not self.job_over:
                sys.stderr.write(signals.stopped_line(0, sig))
            if self.exited is None and not (self.interrupted or self.awaiting.is_set()
                                            or self._reached_rank_zero(sig)):
                send_to_group(self.pid, sig, group=False)
            again = len(self.received) > 1
            if not self._exited_within(0.0 if again else self.grace.interrupt_s, stopped=sig):
                sys.stderr.write(signals.killed_line("rank 0", self.pid, the_programs_task=True, again=again))
            elif self.job_over and len(self.received) < 2:
                return _exit_code(self.exited or 0)
        self._kill_rank_zero()
        return 128 + sig

    def _reached_rank_zero(self, sig: int, again: bool = False) -> bool:
        """Whether `sig`, which this process got, reached rank 0's process too: a terminal's Ctrl-C, or a signal to the
        whole process group (`kill -INT -PGID`, `timeout`), which the witness saw; passed on, its handler ran twice.
        `again`: `sig` may come again (SIGUSR1), so the witness, where it stays pending, is replaced once it saw it."""
        if sig == signal.SIGINT and self.sees_ctrl_c:
            return True
        if not self.witness.saw(sig):
            return False
        if again:
            seen, self.witness = self.witness, _GroupWitness()
            self.own_children.add(self.witness.pid)
            seen.close()
        return True

    def _kill_rank_zero(self) -> None:
        """SIGKILL rank 0's process (what it started is the job's) and wait for its end, bounded (`Children.kill`)."""
        self._watching()
        if self.exited is None:
            with suppress(KeyboardInterrupt, Terminated):  # asked again meanwhile: it has had its SIGKILL
                self.rank_zero.kill(group=False)

    def _stop_what_rank_zero_left(self) -> None:
        """Stop what rank 0's process left running: what it forked (DataLoader workers, say) is this process's child
        since (`adopt_orphans`), found even without a cgroup, and stopped as the job's other processes are (SIGTERM,
        `TERM_WAIT_S`, SIGKILL); what that leaves comes in the next round, until the bound is spent."""
        seen, end = set(self.own_children), time.monotonic() + TERM_WAIT_S + KILL_WAIT_S
        with suppress(KeyboardInterrupt, Terminated, _Hangup):  # asked again: they have had their SIGKILL
            while (left := self._orphans(seen)) and time.monotonic() < end:
                seen |= left
                orphans = Children()
                for pid in left:
                    orphans.adopt(pid, "a process rank 0 started")
                orphans.stop(signal.SIGTERM, TERM_WAIT_S, group=False)

    def _stop_what_rank_zero_started(self) -> None:
        """Stop what rank 0's task forked during the job and still runs as the job ends, as the job's cgroup has it
        stopped where there is one: without a cgroup a fork that runs no exec (a `multiprocessing.Process`) is not
        known as the job's, and rank 0's process, whose exit joins it, would wait for it (for ever, after a failure)."""
        forks = _descendants(self.pid) - self.before_job
        if forks:
            with suppress(KeyboardInterrupt, Terminated, _Hangup):  # asked again: they have had their SIGKILL
                running = Children()
                for pid in forks:
                    with suppress(ProcessLookupError):  # (ended meanwhile)
                        running.adopt(pid, "a process rank 0 started")
                running.stop(signal.SIGTERM, TERM_WAIT_S, group=False)

    def _reap_orphans(self) -> None:
        """Reap what rank 0's task left (`adopt_orphans`) and has ended, so background commands (`cmd &`) of a long run
        leave no zombies piling up."""
        for pid in self._orphans(self.own_children):
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    def _orphans(self, known: set[int]) -> set[int]:
        """This process's children but `known`, its rank starters and the ranks' process groups (theirs once their
        starter is gone, and handled by then): what rank 0 left, in the program's process group or in a session of its
        own (`setsid`, a daemon's double fork)."""
        left = set()
        for pid in children_of_this_process() - known - launched:
            with suppress(ProcessLookupError):
                if os.getpgid(pid) not in self.rank_pids:
                    left.add(pid)
        return left

    def _exited_within(self, seconds: float, stopped: int | None = None) -> bool:
        """Whether rank 0's process ended within `seconds`; rank 0 hears `stopped` whenever it waits for an answer."""
        self._watching()
        end = time.monotonic() + seconds
        while self.exited is None:
            if stopped is not None and self.awaiting.is_set():
                self._answer(JobSettled(None, stopped=stopped))
            try:
                self._next_event(end)
            except queue.Empty:
                return False
        return True

    def _next_event(self, end: float = float("inf")) -> JobStarting | RunEnded | TaskEnded | None:
        """The next of `events`, waited for until `end` (monotonic; then `queue.Empty`) in slices of `WAIT_SLICE_S`, so
        that a signal the kernel gave to another thread is handled."""
        while True:
            try:
                return self.events.get(timeout=max(0.0, min(WAIT_SLICE_S, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= end:
                    raise

    def _watching(self) -> None:
        """Start `_watch`'s thread, if not yet started."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="ddpw-rank-0", daemon=True)
            self._watcher.start()

    # ------------------------------------------------------------------ what rank 0's process says
    def _watch(self) -> None:
        """The thread that reads rank 0's channel into `events` (its task's end into the job's inbox too), then its exit
        code. Watched by its pidfd: a process its task forked may hold the channel open after rank 0 ended. While rank
        0 says nothing, what it left that ended is reaped (`_reap_orphans`)."""
        pidfd = os.pidfd_open(self.pid)
        while True:
            ready = select.select([self.channel.fileno(), pidfd], [], [], WAIT_SLICE_S)[0]
            if not ready:
                self._reap_orphans()
                continue
            if self.channel.fileno() not in ready:
                break  # it ended, and what it said before has been read
            if pidfd in ready:  # it ended: a message it did not finish sending is not waited for
                self.channel.sock.settimeout(WAIT_SLICE_S)
            try:
                message, _ = self.channel.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, ExitBegan):
                self.exit_began = message.at
            if isinstance(message, (JobStarting, TaskEnded)):
                self.awaiting.set()
            if isinstance(message, TaskEnded):
                if message.result is not None and self.result_file is not None:
                    write_atomically(self.result_file, pickle.dumps(message.result))
                self.task_ended.set()
                ranks = self.ranks
                if ranks is not None:
                    ranks.inbox.put(RankExited(self.pid, 0 if message.result is not None and message.result.ok else 1))
            if isinstance(message, (JobStarting, RunEnded, TaskEnded)):
                self.events.put(message)
        os.close(pidfd)
        self.exited = wait_for_exit(self.pid)
        self.rank_zero.inbox.put(RankExited(self.pid, self.exited))
        ranks = self.ranks
        if ranks is not None and not self.task_ended.is_set():
            if self.exited == 0 and self.result_file is not None and ranks.local.payload.task_mark(0).exists():
                # The program ended with status 0 in its task (`sys.exit()` there, past Hydra's job): its task
                # returned, as a rank's `sys.exit(0)` does (a plain run's rank 0 hands no value back).
                # It ended as its exit began (its peers' connections then still open), not when this saw it end.
                result = RankResult(0, exited="it exited with code 0 in its task (sys.exit(0), say)")
                result.finished_at = min(self.exit_began or result.finished_at, result.finished_at)
                write_atomically(self.result_file, pickle.dumps(result))
            ranks.inbox.put(RankExited(self.pid, self.exited))
        self.events.put(None)


def _descendants(pid: int) -> set[int]:
    """The live processes below `pid` (its children, theirs, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError, IndexError, ValueError):
            if entry.name.isdigit():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] not in ("Z", "X"):
                    parents[int(entry.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        above = todo.pop()
        below = [child for child, parent in parents.items() if parent == above and child not in found]
        found.update(below)
        todo += below
    return found


def _pickled(error: BaseException) -> bytes:
    """`error` pickled for rank 0's process (its text when it cannot be pickled)."""
    return portable_pickle(error) or pickle.dumps(RuntimeError(str(error)))


class _GroupWitness:
    """A child of the supervisor in the program's process group, with every signal blocked: a signal sent to the whole
    group (and so to rank 0's process) stays pending in it, where the kernel shows it (`/proc/PID/status`), while one
    sent to the supervisor alone (`kill PID`) does not. Started after rank 0's fork (a signal before it reached rank 0
    too, and is passed on), stopped with the run (or as the supervisor dies)."""

    def __init__(self) -> None:
        parent = os.getpid()
        with blocked(tuple(signal.valid_signals())):
            pid = os.fork()
            if pid == 0:  # (only system calls: the fork of a process that may have threads)
                try:
                    die_with_parent(signal.SIGKILL)
                    if os.getppid() == parent:
                        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                        while True:
                            signal.pause()
                finally:
                    os._exit(0)
        self.process = Children()
        self.process.adopt(pid, "the supervisor's process-group witness")
        self.pid = pid

    def saw(self, sig: int) -> bool:
        """Whether `sig` was sent to the process group since the witness started."""
        with suppress(OSError):
            with open(f"/proc/{self.pid}/status", encoding="ascii") as status:
                masks = [int(line.split()[1], 16) for line in status if line.startswith(("ShdPnd:", "SigPnd:"))]
            return any(mask >> (sig - 1) & 1 for mask in masks)
        return False

    def close(self) -> None:
        """Stop it (bounded)."""
        self.process.kill(group=False)


def _in_foreground() -> bool:
    """Whether this process is in its terminal's foreground group (a Ctrl-C typed there reaches rank 0 too)."""
    for fd in (0, 1, 2):
        with suppress(OSError):
            return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def _exit_code(code: int) -> int:
    """A process's exit code as a shell gives it (128 + the signal for a process killed by one)."""
    return 128 - code if code < 0 else code
