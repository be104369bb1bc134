"""A plain run (no `-m`) with a ddpw launcher: Hydra's own run mode, with the user's process as rank 0. The
launcher options install `PlainRun`, a callback: `on_run_start` checks and forks the job's supervisor
(`procs/run_supervisor.py`), `on_job_start` joins the job, `on_job_end` leaves it (and starts it again while
restarts are left), `on_run_end` names the threads that keep the program running (docs/architecture.md,
"A plain run is Hydra's own run mode", for the rest and the limits).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import pickle
import signal
import sys
import threading
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
from ddpw_runtime.hydra_jobs.prepare import as_typed, command_line, hydra_config_of, job_check, pin_now, task_config
from ddpw_runtime.hydra_jobs.task import append_to_job_files
from ddpw_runtime.launch.engine import describe
from ddpw_runtime.launch.payload import TaskCall
from ddpw_runtime.launch.plan import DUMP_SIGNAL, stacks_file
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.protocol import Channel, JobSettled, JobStarting, RankZero, RunEnded, TaskEnded
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.launch.supervisor import STOP_SIGNAL
from ddpw_runtime.rank.own_process import RankInThisProcess, left_open, on_stack, open_log

_T = TypeVar("_T")


class PlainRun(Callback):
    """The callback the ddpw launcher options install (see the module docstring). It acts in a plain run with a
    ddpw launcher selected; in a multirun the launcher does the work, but across machines (a node other than 0
    follows node 0's sweep; node 0 says when it ended)."""

    _rank_zero: RankZeroSide | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check the platform and the launcher options, pin `${now:...}` values for every rank; a dry run
        prints the plan and ends there; then fork the job's supervisor. Whatever fails here (a bad value, or
        anything else) ends the program with its error, as Hydra ends a run on a bad config: Hydra would only
        warn about a callback's error and run the task alone, in this process."""
        self._rank_zero = _in_rank_zero(lambda: _start_run(config))

    def on_job_start(self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any) -> None:
        """Make this process rank 0 of the job; the supervisor starts the other ranks. What fails here ends
        the program with its error (see `on_run_start`). (`hydra.mode` is None where a program composes and runs
        the job itself, as `hydra_zen.launch` does.)"""
        rank_zero = self._rank_zero
        if rank_zero is not None and config.hydra.mode is not RunMode.MULTIRUN:
            _in_rank_zero(lambda: rank_zero.start(task_config(config), task_function))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Leave the job; its return becomes the job's (every rank's) outcome. What fails here ends the program
        with its error (see `on_run_start`)."""
        rank_zero = self._rank_zero
        if rank_zero is not None:
            _in_rank_zero(lambda: rank_zero.end(job_return))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A node other than 0 of a multirun across machines follows node 0's sweep (`procs/node.py`), then the
        program ends: the sweep itself runs on node 0 only."""
        _compat.report_like_hydra(lambda: _follow_sweep(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Node 0 of a multirun across machines: tell the other nodes that the sweep ended. Ctrl-C and SIGTERM are
        handled as before the sweep again (`signals.uninstall`)."""
        from ddpw_runtime.launch import signals
        from ddpw_runtime.nodes.sweep_channel import end_hosted

        end_hosted()
        signals.uninstall()

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Tell the supervisor the run is over (and which threads keep the program running)."""
        if self._rank_zero is not None:
            self._rank_zero.run_ended()


def _in_rank_zero(action: Callable[[], _T]) -> _T:
    """`action` (hydra-ddpw's part of the run in rank 0's process, around its task), its error ending the program as
    Hydra shows one (`_compat.report_like_hydra`); a Ctrl-C in it ends the run quietly (`_ended_by`), as the
    supervisor (the program's own process, once forked) ends it: it has the Ctrl-C too. (While rank 0 waits for the
    supervisor, `_next_message` takes a Ctrl-C and waits for the job's end.) Only the first Ctrl-C is raised here
    (`_interrupted_once`): the supervisor passes a Ctrl-C sent to the program's process group on to rank 0 as well,
    and a second one raised while the first is handled showed its traceback."""
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (not where the program ignores Ctrl-C)
    if ours:
        _interrupts.clear()
        signal.signal(signal.SIGINT, _interrupted_once)
    try:
        done = _compat.report_like_hydra(action)
        if _interrupts:  # one that code run meanwhile dropped (`_interrupted_once`)
            raise KeyboardInterrupt
        return done
    except KeyboardInterrupt:
        _ended_by(signal.SIGINT)
    finally:
        if ours and signal.getsignal(signal.SIGINT) is _interrupted_once:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the task's Ctrl-C is Python's own


_interrupts: list[int] = []
"""The Ctrl-Cs that came in hydra-ddpw's part of rank 0 (in `_in_rank_zero`'s action)."""


def _interrupted_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C in hydra-ddpw's part of rank 0: raise KeyboardInterrupt, note it, and ignore the Ctrl-Cs that follow
    (the supervisor has them too). Code run meanwhile may drop the exception (an extension module's import as rank 0
    seeds numpy, which runs this handler inside an ABC's check and loses what it raised): rank 0 would then go on into
    its task deaf to Ctrl-C, and the job would wait its whole grace. The note makes rank 0 stop as it joins its job,
    and `_in_rank_zero` end the program as its action returns."""
    _interrupts.append(signum)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _ended_by(signum: int) -> NoReturn:
    """End the program as stopped by `signum` (exit 128 + `signum`), quietly, as a Ctrl-C in the task ends a run. A
    Ctrl-C from now on is ignored: the supervisor passes the terminal's on to rank 0 as well, and one that lands as
    the program ends would cut its end short with a traceback; a second Ctrl-C still makes the supervisor stop what is
    left at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _follow_sweep(config: DictConfig) -> None:
    """`on_multirun_start`'s work: on a node other than 0 of a multirun across machines, follow node 0's sweep and
    exit with this node's code."""
    options = selected_options(config.hydra.launcher)
    if options is None or options.dry_run or not options.runs_here:  # (SLURM starts every node itself)
        return
    from ddpw_runtime.nodes.environment import place_node

    with hydra_config_of(config), options.naming_platform_keys():
        platform = options.platform_of(config)
        if platform.n_nodes == 1:  # (the launcher checks the rest, job by job)
            return
        platform = place_node(platform.validate())
    if platform.node_rank:
        from ddpw_runtime.procs.node import follow_sweep

        sys.exit(follow_sweep(platform, options, command_line(config.hydra)))


def _start_run(config: DictConfig) -> RankZeroSide | None:
    """`on_run_start`'s work: rank 0's side of the run (this process, once forked); None where no ddpw launcher
    is selected. A dry run prints the plan and exits, reading the overrides as typed (a value that resolves
    only inside a rank, `${oc.env:LOCAL_RANK}` say, is shown, not resolved)."""
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
            output_dir = Path(str(config.hydra.run.dir)).absolute()
            overrides = list(as_typed(config.hydra.overrides.task))
            print(f"--- job #0: {' '.join(filter_overrides(overrides)) or '(no overrides)'} (dry run, nothing "
                  f"started)\n{describe(platform, output_dir)}")
            sys.exit(0)
    return RankZeroSide.fork(platform, options)


def checked_platform(config: DictConfig, options: LauncherOptions) -> Platform:
    """The platform of a plain run's job config (`config`, with or without its `hydra` node), after
    every check a plain run must pass."""
    from ddpw_runtime.launch.checks import check_caller_rank, gpus_available
    from ddpw_runtime.nodes.environment import place_node

    platform = options.platform_of(config)
    with options.naming_platform_keys():  # (this machine's GPUs first: device=gpu on a machine without one says so)
        platform = place_node(platform.validate(gpus_available(platform)))
    job_check(options, platform)
    check_caller_rank(platform)
    return platform


_stoppable: set[CodeType] = set()
"""Code of the frames inside which rank 0 of this process may be stopped: its task, and its joining."""
_stopped = threading.Event()


def _on_stop(signum: int, frame: FrameType | None) -> None:
    """`STOP_SIGNAL` from the supervisor: another rank failed or the time limit passed."""
    if on_stack(frame, _stoppable):
        _stopped.set()
        raise RankStopped()


def _in_forks() -> None:
    """In a process the task forks: none of hydra-ddpw's handling (its signal's default action, as without it)."""
    if signal.getsignal(STOP_SIGNAL) is _on_stop:
        signal.signal(STOP_SIGNAL, signal.SIG_DFL)
        faulthandler.unregister(DUMP_SIGNAL)


def _as_it_ends() -> None:
    """The program ends (its task may have called `sys.exit` while in its job): the supervisor's requests
    (`DUMP_SIGNAL`, `STOP_SIGNAL`) are ignored from now on. Python gives up its handlers as it finalizes, and a
    real-time signal's default action would end the process, whose exit code would then be that signal's, not its
    own."""
    with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C now ends the program as it was ending anyway
        faulthandler.unregister(DUMP_SIGNAL)
        for sig in (DUMP_SIGNAL, STOP_SIGNAL):
            signal.signal(sig, signal.SIG_IGN)
        _flush_left_open()


def _flush_left_open() -> None:
    """Flush the files the task left open. What the program holds was frozen at the fork (`fork_supervisor`), so
    Python does not free it as it ends, and what such a file holds back would be lost. Flushed, not closed: an exit
    handler registered before the run, which runs after this one, may still write to it. But a file written in Python
    over another (gzip, bz2, lzma) is closed: only that writes its end. Unfreezing instead costs the program 0.3 s
    (torch freed)."""
    for file in left_open():
        with contextlib.suppress(Exception):
            file.flush()
    for file in _compat.open_files(gc.get_objects()):  # (made since the fork: what was there before is frozen)
        if type(file).__module__ != "_io":
            with contextlib.suppress(Exception):
                file.close()


class RankZeroSide:
    """Rank 0 of a plain run, in the user's own process, and its channel to the supervisor."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.task: TaskCall | None = None
        self.rank: RankInThisProcess | None = None
        self.log_file: Path | None = None
        """Rank 0's log, once it has joined a job."""
        signal.signal(STOP_SIGNAL, _on_stop)
        # Where it was, when the supervisor asks (`DUMP_SIGNAL`): into rank 0's stacks file
        # while this process is rank 0, nowhere once it has left (not onto the terminal). Registered for the
        # whole run, so the request never finds it unregistered.
        self._dumps = os.open(os.devnull, os.O_WRONLY)
        faulthandler.register(DUMP_SIGNAL, file=self._dumps, all_threads=True)
        os.register_at_fork(after_in_child=_in_forks)
        atexit.register(_as_it_ends)

    @staticmethod
    def fork(platform: Platform, options: LauncherOptions) -> RankZeroSide:
        """Fork the program: this call returns in the fork, which goes on as rank 0; the program's own
        process supervises the job (`run_supervisor.py`). With a build of torch without GPU support,
        torch is imported first, so the supervisor forks the ranks with it loaded (one import, not two)."""
        from ddpw_runtime.procs.run_supervisor import fork_supervisor

        if "torch" not in sys.modules and _compat.torch_without_gpu_support():
            import torch  # noqa: F401  (see above)
        return RankZeroSide(fork_supervisor(platform, options))

    def start(self, task_cfg: DictConfig, task_function: TaskFunction) -> None:
        """The job is starting: the supervisor starts the other ranks, this process joins them. It appends to the job
        log from now on (`mode: w` too), as the supervisor does."""
        append_to_job_files()
        self.task = TaskCall(task_function, (task_cfg,))
        output_dir = str(HydraConfig.get().runtime.output_dir)
        _stoppable.add(_code_of(task_function))
        _stoppable.add(RankInThisProcess.enter.__code__)
        overrides = command_line(HydraConfig.get())
        self.channel.send(JobStarting(self.task.pack(), ProcessState.capture(), output_dir, overrides))
        self._join()

    def _join(self) -> None:
        """Take on rank 0's part of this attempt, as the supervisor gives it; a job that cannot start ends
        the run here, with its error (unless the supervisor starts it again: then join the next attempt)."""
        while True:
            message, fds = self._next_message()
            if isinstance(message, JobSettled):
                _end_run(message, None)
            assert isinstance(message, RankZero)
            self.log_file = message.plan.log_file(0)
            output = fds[0] if message.terminal else open_log(self.log_file)
            stacks = open_log(stacks_file(message.plan.log_dir, 0))
            os.dup2(stacks, self._dumps, inheritable=False)
            os.close(stacks)
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
                self._no_dumps()
                self.channel.send(TaskEnded(None if stopped else RankResult.failure(0, exc)))
                settled = self._settled()
                if not settled.restart:
                    _end_run(settled, None if stopped else exc)

    def end(self, job_return: JobReturn) -> None:
        """Rank 0's task ended as `job_return`: leave the job, hear how it ended, start it again while the
        supervisor says so, and make the job's failure (another rank's) the return."""
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
        """Leave the process group, say how the task ended, and hear how the job ended. How a stopped task ended
        goes to rank 0's log, not to the console (the job's error says why the job was stopped), and what its
        frames held (a DataLoader and its workers, say) is let go while rank 0's output still goes there."""
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
        self._no_dumps()
        self.channel.send(TaskEnded(result))
        return self._settled()

    def _no_dumps(self) -> None:
        """Stack dumps go nowhere from now on (this process is no longer rank 0)."""
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._dumps, inheritable=False)
        os.close(null)

    def _settled(self) -> JobSettled:
        message, _ = self._next_message()
        assert isinstance(message, JobSettled)
        return message

    def _next_message(self) -> tuple[object, list[int]]:
        """The supervisor's next message, read on a thread (where no signal handler runs, so no message is
        cut short). An error that a signal handler of the task raises meanwhile is no longer the task's (such
        as torch's, when the job's end stops the workers of a DataLoader the task left): it goes to rank 0's
        log, and the wait goes on. So does a Ctrl-C: the supervisor has it too (it passed it on) and answers how the
        job ended; told to join meanwhile, rank 0 is stopped as it joins. The message waits in a list the thread fills,
        not in a queue's return value: a handler that raises just as the wait returns cannot lose it."""
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
        """Write `error` (what rank 0 `what`) to rank 0's log, not to the console (before it has a log: stderr)."""
        text = f"--- rank 0 {what}:\n{''.join(traceback.format_exception(error))}"
        if self.log_file is None:
            sys.stderr.write(text)
            return
        with contextlib.suppress(OSError), open(self.log_file, "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(text)

    def run_ended(self) -> None:
        """Hydra's run is over: name the non-daemon threads that keep the program running, if any."""
        threads = tuple(t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread())
        with contextlib.suppress(OSError):
            self.channel.send(RunEnded(threads))


def _end_run(settled: JobSettled, own: BaseException | None) -> None:
    """End the run as Hydra ends one: the job's error (or rank 0's `own`, when it is the cause) as Hydra
    shows any, or quietly for the signal that stopped the job, as a Ctrl-C in the task ends a run (also
    when rank 0's task then failed only because its peers went away). For a job that could not start, or
    that was interrupted while it started or while rank 0's task ran."""
    if settled.stopped is not None:
        _ended_by(settled.stopped)
    error = pickle.loads(settled.error) if settled.error is not None else own
    _compat.report_like_hydra(lambda: _raise(error or RuntimeError("the job could not start")))


def _raise(error: BaseException) -> None:
    raise error


def _pending_signal_handlers_run() -> None:
    """Nothing: Python runs the signal handlers whose signals came while the main thread waited when a function
    starts (a signal that another thread took does not wake the main thread), so their errors are raised
    here, where the caller expects them."""


def _code_of(task_function: Any) -> CodeType:
    """The code that runs when `task_function` (a function, method, partial or object with `__call__`) is called."""
    target = getattr(task_function, "func", task_function)
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    return code if isinstance(code, CodeType) else TaskCall.__call__.__code__
