"""A plain run (no `-m`) with a ddpw launcher: Hydra's own run mode, the user's process as rank 0. `PlainRun`, the
callback the launcher options install: `on_run_start` checks and forks the supervisor (`procs/run_supervisor.py`),
`on_job_start` joins the job, `on_job_end` leaves it (and starts it again while restarts are left), `on_run_end` names
the threads that keep the program running (docs/architecture.md, "A plain run is Hydra's own run mode")."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NoReturn, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.experimental.callback import Callback
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import LauncherOptions, selected_options
from ddpw_runtime import _compat
from ddpw_runtime.errors import RankStopped
from ddpw_runtime.hydra_jobs.mandatory import check_given
from ddpw_runtime.hydra_jobs.prepare import as_typed, command_line, hydra_config_of, job_check, pin_now, task_config
from ddpw_runtime.hydra_jobs.task import append_to_job_files
from ddpw_runtime.launch.engine import describe
from ddpw_runtime.launch.outcome import ends_a_line
from ddpw_runtime.launch.payload import TaskCall
from ddpw_runtime.launch.plan import DUMP_SIGNAL, stacks_file
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.protocol import Channel, ExitBegan, JobSettled, JobStarting, RankZero, RunEnded, TaskEnded
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.launch.starter import import_torch_first
from ddpw_runtime.launch.supervisor import STOP_SIGNAL
from ddpw_runtime.rank import recorder
from ddpw_runtime.rank.own_process import (
    ImportHold,
    RankInThisProcess,
    end_frozen,
    flush_output,
    on_stack,
    open_log,
)

_T = TypeVar("_T")


class PlainRun(Callback):
    """The callback the ddpw launcher options install (see the module docstring), acting in a plain run with a ddpw
    launcher; in a multirun the launcher does the work, but across machines (other nodes follow node 0's sweep)."""

    _rank_zero: RankZeroSide | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check the platform and options, pin `${now:...}` for every rank (a dry run prints the plan and ends), fork
        the supervisor. What fails here ends the program with its error, as Hydra ends a run on a bad config (Hydra
        would only warn about a callback's error and run the task alone, in this process)."""
        self._rank_zero = _in_rank_zero(lambda: _start_run(config))

    def on_job_start(self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any) -> None:
        """Make this process rank 0 of the job (the supervisor starts the others); errors as in `on_run_start`.
        (`hydra.mode` is None where a program composes and runs the job itself, as `hydra_zen.launch` does.)"""
        rank_zero = self._rank_zero
        if rank_zero is not None and config.hydra.mode is not RunMode.MULTIRUN:
            _in_rank_zero(lambda: rank_zero.start(task_config(config), task_function))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Leave the job; its return becomes every rank's outcome. Errors as in `on_run_start`."""
        rank_zero = self._rank_zero
        if rank_zero is not None:
            _in_rank_zero(lambda: rank_zero.end(job_return))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A node other than 0 of a multirun across machines follows node 0's sweep (`procs/node.py`), then exits."""
        _compat.report_like_hydra(lambda: _follow_sweep(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Node 0 of a multirun across machines: tell the other nodes the sweep ended; Ctrl-C and SIGTERM are handled
        as before the sweep again (`signals.uninstall`)."""
        from ddpw_runtime.launch import signals
        from ddpw_runtime.nodes.sweep_channel import end_hosted

        end_hosted()
        signals.uninstall()

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Tell the supervisor the run is over (and which threads keep the program running)."""
        if self._rank_zero is not None:
            self._rank_zero.run_ended()


def _in_rank_zero(action: Callable[[], _T]) -> _T:
    """`action` (hydra-ddpw's part of rank 0's process), its error ending the program as Hydra shows one; a Ctrl-C in
    it ends the run quietly (`_ended_by`), as the supervisor, which has it too, ends it. Only the first Ctrl-C is
    raised (`_interrupted_once`): the supervisor passes one sent to the process group on to rank 0 as well, and a
    second one raised while the first is handled showed its traceback."""
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (not where the program ignores Ctrl-C)
    try:  # (outside all of it: a Ctrl-C while the handler is put in place or taken back ends the run quietly too)
        if ours:
            _interrupts.clear()
            signal.signal(signal.SIGINT, _interrupted_once)
        try:
            done = _compat.report_like_hydra(action)
            if _interrupts:  # one that code run meanwhile dropped (`_interrupted_once`)
                raise KeyboardInterrupt
            return done
        finally:
            if ours and signal.getsignal(signal.SIGINT) is _interrupted_once:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # the task's Ctrl-C is Python's own
    except KeyboardInterrupt:
        _ended_by(signal.SIGINT)


_interrupts: list[int] = []
"""The Ctrl-Cs that came in hydra-ddpw's part of rank 0 (in `_in_rank_zero`'s action)."""


def _interrupted_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C in hydra-ddpw's part of rank 0: note it, ignore those that follow (the supervisor has them too), raise
    KeyboardInterrupt. Code run meanwhile may drop it (numpy's import as rank 0 seeds ran this in an ABC check, which
    lost it): the note still stops rank 0 as it joins, or the program as `_in_rank_zero`'s action returns, instead of
    rank 0 going on into its task deaf to Ctrl-C while the job waits its whole grace."""
    _interrupts.append(signum)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _ended_by(signum: int) -> NoReturn:
    """End the program quietly as stopped by `signum` (exit 128 + `signum`), as a Ctrl-C in the task does. Ctrl-C is
    ignored from now on: the supervisor passes the terminal's on to rank 0 too, and one landing as the program ends
    would show a traceback; a second Ctrl-C still makes the supervisor stop what is left at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _follow_sweep(config: DictConfig) -> None:
    """`on_multirun_start`'s work: a node other than 0 follows node 0's sweep and exits with its code."""
    options = selected_options(config.hydra.launcher)
    if options is None or options.dry_run or not options.runs_here:  # (SLURM starts every node itself)
        return
    from ddpw_runtime.nodes.environment import place_node

    with hydra_config_of(config), options.naming_platform_keys():
        try:
            platform = options.platform_of(config)
        except ConfigError:
            # The multirun's config is no job's: Hydra composes it without the sweep's values, so a platform value
            # that refers to a swept key (`platform.n_procs_per_node=${nproc} +nproc=1,2`) cannot be resolved here.
            # On one node the launcher checks each job's own platform; only more nodes need this one read.
            from omegaconf import OmegaConf

            if OmegaConf.select(config, f"{options.platform_key}.n_nodes", default=None,
                                throw_on_resolution_failure=False) == 1:
                return
            raise
        if platform.n_nodes == 1:  # (the launcher checks the rest, job by job)
            return
        platform = place_node(platform.validate())
    if platform.node_rank:
        from ddpw_runtime.procs.node import follow_sweep

        sys.exit(follow_sweep(platform, options, command_line(config.hydra)))


def _start_run(config: DictConfig) -> RankZeroSide | None:
    """`on_run_start`'s work: rank 0's side of the run (None without a ddpw launcher). A dry run prints the plan and
    exits, showing the overrides as typed (`${oc.env:LOCAL_RANK}`, resolved only in a rank, is shown as is)."""
    options = selected_options(config.hydra.launcher)
    if options is None:
        return None
    if options.resume:  # (`fail_fast` holds by itself: a plain run is one job, which ends the run when it fails)
        raise ConfigError("hydra.launcher.resume", True, "a plain run is one job, not a sweep to go on with: resume a "
                          "sweep with -m and its hydra.sweep.dir, or run again without resume")
    with hydra_config_of(config):
        platform = checked_platform(config, options)
        if platform.node_rank and not options.dry_run:  # another node of a job across machines: it follows node 0's
            from ddpw_runtime.procs.node import follow

            sys.exit(follow(platform, options, command_line(config.hydra)))
        pin_now(config)
        if options.dry_run:
            shown = " ".join(filter_overrides(list(as_typed(config.hydra.overrides.task))))
            print(f"--- job #0: {shown or '(no overrides)'} (dry run, nothing started)\n"
                  f"{describe(platform, Path(str(config.hydra.run.dir)).absolute(), config.hydra.job.env_set)}")
            sys.exit(0)
    return RankZeroSide.fork(platform, options)


def checked_platform(config: DictConfig, options: LauncherOptions) -> Platform:
    """The platform of a plain run's job `config` (with or without its `hydra` node), every plain run check passed."""
    from ddpw_runtime.launch.checks import check_caller_rank, gpus_available
    from ddpw_runtime.nodes.environment import place_node

    check_given(config, options.platform_key)
    platform = options.platform_of(config)
    with options.naming_platform_keys():  # (this machine's GPUs first: device=gpu on a machine without one says so)
        platform = place_node(platform.validate(gpus_available(platform)))
    job_check(options, platform)
    check_caller_rank(platform)
    return platform


_stoppable: set[CodeType] = set()
"""Code of the frames inside which rank 0 of this process may be stopped: its task, and its joining."""
_stopped = threading.Event()
_import_hold = ImportHold(lambda: signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL))


def _on_stop(signum: int, frame: FrameType | None) -> None:
    """`STOP_SIGNAL` from the supervisor: another rank failed or the time limit passed. The task's own SIGTERM handler
    (a checkpoint on SIGTERM) runs first, as it does in the other ranks, which are sent SIGTERM. Its `sys.exit`, which
    ends such a rank, ends only rank 0's task here: this process is the program, which may run the job again."""
    if on_stack(frame, _stoppable):
        _stopped.set()
        if _import_hold.holds(frame):
            return
        if callable(own := signal.getsignal(signal.SIGTERM)):
            with contextlib.suppress(SystemExit):
                own(signal.SIGTERM, frame)
        raise RankStopped()


def _stacks_asked(signum: int, frame: FrameType | None) -> None:
    """Python's handler of `DUMP_SIGNAL` in rank 0 of a plain run: nothing (faulthandler's writes the stacks)."""


_forks_dump: int | None = None
"""Rank 0's stack dumps (the descriptor) while it is in a job, which what its task forks keeps (`_in_forks`)."""


def _in_forks() -> None:
    """In a process the task forks: none of hydra-ddpw's handling (its signal's default action, as without it), but
    while rank 0 is in a job (`_forks_dump`) a stack dump on `DUMP_SIGNAL` into rank 0's stacks file, as a fork of
    another rank keeps it: the supervisor asks rank 0's DataLoader's workers where they are (`hangs._with_workers`),
    only while rank 0 is in that job (what the task forked is stopped as the job ends); a process forked outside a job
    does not catch the signal, so it is never asked. The fork dumps the stack of the thread the signal came to only
    (the main one, unless it blocks signals): faulthandler, reading the other threads' stacks as they run (a worker's
    queue feeder), crashes a busy worker now and then (SIGSEGV, its DataLoader then fails the rank)."""
    if signal.getsignal(STOP_SIGNAL) is _on_stop:
        signal.signal(STOP_SIGNAL, signal.SIG_DFL)
        recorder.no_stacks()
        if (dumps := _forks_dump) is None:
            signal.signal(DUMP_SIGNAL, signal.SIG_DFL)
        else:
            recorder.keep_stacks(lambda: faulthandler.register(DUMP_SIGNAL, file=dumps, all_threads=False))


def _as_it_ends() -> None:
    """At the program's end (maybe a `sys.exit` in the task): ignore `DUMP_SIGNAL` and `STOP_SIGNAL`, whose default
    action would end the process with that signal's code once Python drops its handlers as it finalizes; the files
    the task left open keep what they hold, and Python's last collections do not walk the heap (`end_frozen`; most of
    it was frozen at the fork already)."""
    with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C now ends the program as it was ending anyway
        recorder.no_stacks()
        for sig in (DUMP_SIGNAL, STOP_SIGNAL):
            signal.signal(sig, signal.SIG_IGN)
        end_frozen()


_program_output: list[int] = []
"""Copies of the program's own fds 1 and 2, while those write where a job's supervisor said (`_output_to`)."""


def _output_to(fds: list[int]) -> None:
    """From its job's end until the process ends, fds 1 and 2 write into `fds` (the supervisor copies them to the
    console and rank 0's log); the program's own are put back when it runs another job (`_program_output_back`)."""
    if len(fds) != 2:
        return
    flush_output()
    if not _program_output:
        _program_output.extend((os.dup(1), os.dup(2)))
    for fd, new in zip((1, 2), fds, strict=True):
        os.dup2(new, fd)
        os.close(new)


def _program_output_back() -> None:
    """The program's own fds 1 and 2 again (a program that runs a job after another, hydra-zen's `launch`)."""
    if _program_output:
        flush_output()
        for fd, saved in zip((1, 2), _program_output, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        _program_output.clear()


class RankZeroSide:
    """Rank 0 of a plain run, in the user's own process, and its channel to the supervisor."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.task: TaskCall | None = None
        self.rank: RankInThisProcess | None = None
        self.log_file: Path | None = None
        """Rank 0's log, once it has joined a job."""
        signal.signal(STOP_SIGNAL, _on_stop)
        # Where it was, when the supervisor asks (`DUMP_SIGNAL`): into rank 0's stacks file while this process is
        # rank 0, nowhere once it has left (not the terminal). Registered for the whole run: never found unregistered.
        # Python's own handler, under faulthandler's, does nothing: a library that sets it back (Lightning's Trainer,
        # as it ends) leaves the process alive, where the default action would end it (`recorder.restore_stacks`).
        self._dumps = dumps = os.open(os.devnull, os.O_WRONLY)
        signal.signal(DUMP_SIGNAL, _stacks_asked)
        # (the descriptor, not `self`: dropping the registration as the program ends must not drop this object)
        recorder.keep_stacks(lambda: faulthandler.register(DUMP_SIGNAL, file=dumps, all_threads=True))
        os.register_at_fork(after_in_child=_in_forks)
        atexit.register(_as_it_ends)
        atexit.register(self._as_it_exits)

    @staticmethod
    def fork(platform: Platform, options: LauncherOptions) -> RankZeroSide:
        """Fork the program: this returns in the fork, rank 0; the program's process supervises (`run_supervisor.py`).
        A CPU-only torch is imported first, so the supervisor forks the ranks with it loaded (one import, not two)."""
        from ddpw_runtime.procs.run_supervisor import fork_supervisor

        _program_output_back()
        import_torch_first()
        return RankZeroSide(fork_supervisor(platform, options))

    def start(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        """The job is starting: the supervisor starts the other ranks, this process joins them, appending to the job
        log from now on (`mode: w` too), as the supervisor does."""
        append_to_job_files()
        self.task = TaskCall(task_function, (task_cfg,))
        output_dir = str(HydraConfig.get().runtime.output_dir)
        _stoppable.update((_code_of(task_function), RankInThisProcess.enter.__code__))
        overrides = command_line(HydraConfig.get())
        self.channel.send(JobStarting(self.task.pack(), ProcessState.capture(), output_dir, overrides))
        self._join()

    def _join(self) -> None:
        """Take on rank 0's part of this attempt; a job that cannot start ends the run here, with its error (unless the
        supervisor starts it again: then join the next attempt)."""
        while True:
            message, fds = self._next_message()
            if isinstance(message, JobSettled):
                _output_to(fds)
                _end_run(message, None)
            assert isinstance(message, RankZero)
            self.log_file = message.plan.log_file(0)
            output = fds[0] if message.terminal else open_log(self.log_file)
            self._dumps_to(stacks_file(message.plan.log_dir, 0))
            _stopped.clear()
            self.rank = RankInThisProcess(message.plan, message.env, output=output)
            try:
                self.rank.enter()
                if _interrupts:  # one that its joining dropped (`_interrupted_once`)
                    self.rank.leave()
                    raise KeyboardInterrupt
                Path(message.task_mark).touch(0o600)
                return
            except BaseException as exc:  # rank 0 could not join (or was interrupted): the job's end says why
                stopped = _stopped.is_set() or not isinstance(exc, Exception)
                self.rank = None
                self._dumps_to(None)
                self.channel.send(TaskEnded(None if stopped else RankResult.failure(0, exc)))
                settled = self._settled()
                if not settled.restart:
                    _end_run(settled, None if stopped else exc)

    def end(self, job_return: JobReturn) -> None:
        """Rank 0's task ended as `job_return`: leave the job, start it again while the supervisor says so, and make
        the job's failure (another rank's) the return."""
        settled = self._leave(job_return)
        while settled.restart:
            self._join()
            assert self.task is not None
            try:  # (as Hydra's run_job calls it, so that an error is shown as in Hydra's own run)
                job_return.return_value = _compat.run_job(self.task.target, *self.task.args)
                job_return.status = JobStatus.COMPLETED
            except Exception as exc:  # noqa: BLE001 - as Hydra's run_job takes a task's error
                job_return.return_value, job_return.status = exc, JobStatus.FAILED
            settled = self._leave(job_return)
        if settled.stopped is not None:  # what the task raised meanwhile (a peer gone) is no cause
            _end_run(settled, None)
        if settled.error is not None:
            job_return.status = JobStatus.FAILED
            job_return.return_value = pickle.loads(settled.error)

    def _leave(self, job_return: JobReturn) -> JobSettled:
        """Leave the process group, say how the task ended, hear how the job ended. A stopped task's error goes to rank
        0's log, not the console, its frames (a DataLoader and its workers) let go while output still goes there."""
        from ddpw_runtime.rank.task_init import explained  # torch is loaded: rank 0 joined its job

        ok, error = job_return.status is JobStatus.COMPLETED, _compat.job_error(job_return)
        if error is not None:  # what Hydra shows, when the job's failure is rank 0's own
            job_return.return_value = error = explained(error)
        failed = None if ok or _stopped.is_set() else RankResult.failure(0, error or Exception())
        result = RankResult(0) if ok else failed
        if not ok and result is None and error is not None:
            self._to_log("was stopped", error)
            traceback.clear_frames(error.__traceback__)
        if self.rank is not None:
            self.rank.leave(result, stopped=_stopped.is_set())
            self.rank = None
        self._dumps_to(None)
        self.channel.send(TaskEnded(result))
        return self._settled()

    def _dumps_to(self, stacks: Path | None) -> None:
        """Stack dumps go to rank 0's `stacks` file from now on, and what the task forks keeps them (`_in_forks`); or
        nowhere (None: `os.devnull`) once this is no longer rank 0, and what it forks drops them."""
        global _forks_dump
        _forks_dump = None
        fd = open_log(stacks) if stacks is not None else os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, self._dumps, inheritable=False)
        os.close(fd)
        _forks_dump = self._dumps if stacks is not None else None

    def _settled(self) -> JobSettled:
        message, fds = self._next_message()
        assert isinstance(message, JobSettled)
        _output_to(fds)
        return message

    def _as_it_exits(self) -> None:
        """At the process's end: when its task still runs (a `sys.exit` in it), tell the supervisor when its exit
        began, its peers' connections still open (so that it, not they, is the cause of their failure); close the
        channel (dropped open, Python warns of it as the program ends)."""
        with contextlib.suppress(OSError, KeyboardInterrupt):
            if self.rank is not None:
                self.channel.send(ExitBegan(time.time()))
        self.channel.close()

    def _next_message(self) -> tuple[object, list[int]]:
        """The supervisor's next message, read on a thread (no signal handler runs there to cut it short). An error a
        task's signal handler raises meanwhile (torch's, as the job's end stops a left DataLoader's workers) goes to
        rank 0's log and the wait goes on; so does a Ctrl-C: the supervisor has it too and answers how the job ended
        (told to join meanwhile, rank 0 is stopped as it joins). The message waits in a list the thread fills, not in a
        queue's return value: a handler that raises as the wait returns cannot lose it."""
        received: list[tuple[object, list[int]] | BaseException] = []
        arrived = threading.Event()
        interrupted: KeyboardInterrupt | None = None

        def read() -> None:
            try:
                received.append(self.channel.recv())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
                received.append(exc)
            arrived.set()

        threading.Thread(target=read, name="ddpw-rank-0-channel", daemon=True).start()
        while not received:
            try:
                arrived.wait()
                _pending_signal_handlers_run()
            except KeyboardInterrupt as stop:
                interrupted = stop
            except Exception as error:  # noqa: BLE001 - see above
                self._to_log("raised in a signal handler after its task had ended", error)
        message = received[0]
        if isinstance(message, BaseException):
            raise message
        if interrupted is not None and isinstance(message, RankZero):
            raise interrupted
        return message

    def _to_log(self, what: str, error: BaseException) -> None:
        """Write `error` (what rank 0 `what`) to rank 0's log, not to the console (before it has a log: stderr): on a
        line of its own, `--- rank 0 was stopped: Type: message`, as the other ranks' logs end, then its traceback."""
        headline = traceback.format_exception_only(error)[-1].rstrip("\n")
        text = f"--- rank 0 {what}: {headline}\n{''.join(traceback.format_exception(error))}"
        if self.log_file is None:
            sys.stderr.write(text)
            return
        with contextlib.suppress(OSError), open(self.log_file, "a+b") as log:
            if log.tell() and not ends_a_line(log.fileno()):  # its last write had no newline: `print(.., end="")`
                log.write(b"\n")
            log.write(text.encode("utf-8", errors="backslashreplace"))

    def run_ended(self) -> None:
        """Hydra's run is over: name the non-daemon threads that keep the program running, if any."""
        threads = tuple(t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread())
        with contextlib.suppress(OSError):
            self.channel.send(RunEnded(threads))


def _end_run(settled: JobSettled, own: BaseException | None) -> None:
    """End the run as Hydra does: with the job's error (or rank 0's `own`, when it is the cause), or quietly for the
    signal that stopped the job (even if rank 0's task then failed only as its peers went away)."""
    if settled.stopped is not None:
        _ended_by(settled.stopped)
    error = pickle.loads(settled.error) if settled.error is not None else own
    _compat.report_like_hydra(lambda: _raise(error or RuntimeError("the job could not start")))


def _raise(error: BaseException) -> None:
    raise error


def _pending_signal_handlers_run() -> None:
    """Nothing: Python runs the handlers of signals that came while the main thread waited as a function starts (a
    signal another thread took does not wake it), so their errors are raised here, where the caller expects them."""


def _code_of(task_function: Any) -> CodeType:
    """The code that runs when `task_function` (a function, method, partial or object with `__call__`) is called."""
    target = getattr(task_function, "func", task_function)
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    return code if isinstance(code, CodeType) else TaskCall.__call__.__code__
