"""Signals: to ranks (each leads its own process group, which reaches what it started too); Ctrl-C and SIGTERM held
back while the controller must not be interrupted; the handlers of a multirun's controller; and SIGUSR1/SIGUSR2, the
task's, passed on to it (`PASSED_ON`).

From the launcher's `setup` until the sweep ends, Ctrl-C raises `Interrupted` (exit 130, no traceback) and SIGTERM
`Terminated` (exit 143; a second one ends what runs at once, as a second Ctrl-C does), unless the program was started
ignoring it (`handle`). While jobs run, the launcher passes the signal on to them and says which were stopped; outside
them the handler says so itself."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from ddpw_runtime.errors import Interrupted, Terminated

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)

PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2)
"""Given to the program (a SLURM batch script's `trap 'kill -USR1 $pid' USR1`, for a checkpoint on signal), these are
the task's: passed on to every rank of the running job, each rank alone (not its DataLoader's workers), as no stop (a
rank they kill failed); outside a job, to rank 0's process in a plain run, to nothing in a multirun (a line says so).
The program does not die of them."""


def send_to_group(pid: int, sig: int, group: bool = True) -> None:
    """Send `sig` to the process group led by `pid` (with `group`), or to `pid` alone; one already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def signal_of(stop: BaseException) -> int:
    """The signal an interruption came from: SIGINT for KeyboardInterrupt, else SIGTERM (`Terminated`)."""
    return signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM


def raised_for(signum: int) -> BaseException:
    """What Ctrl-C (SIGINT: KeyboardInterrupt) or SIGTERM (`Terminated`) raises in a process that supervises ranks."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: raise `Terminated`."""
    raise Terminated()


@contextmanager
def blocked(signals: tuple[int, ...]) -> Iterator[set[int | signal.Signals]]:
    """Block `signals` in this thread for the block (across a fork: what a handler raises in its at-fork hooks is
    lost); yields the mask before, read before the change so a handler raising then never leaves them blocked."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        yield before
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextmanager
def held() -> Iterator[None]:
    """Run the block whole: Ctrl-C and SIGTERM that arrive meanwhile reach their handlers right after it. Python runs
    handlers in the main thread only, so this holds them there whichever thread the kernel delivered them to (a signal
    mask would hold them only when no other thread exists). A handler not set from Python is left as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    try:
        for sig in STOPPING_SIGNALS:
            if signal.getsignal(sig) is not None:
                previous[sig] = signal.signal(sig, lambda signum, frame: arrived.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


@contextmanager
def ignored(ignore: bool = True) -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored for the block (with `ignore`; in the main thread, where Python runs handlers)."""
    if not ignore or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOPPING_SIGNALS}
    try:
        for sig in STOPPING_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # (None: set outside Python, and left as is)
                signal.signal(sig, handler)


@contextmanager
def sigterm_raises(handler: Callable[[int, FrameType | None], object] = raise_terminated) -> Iterator[None]:
    """While supervising (main thread), SIGTERM calls `handler`, which raises `Terminated`: the ranks get a grace."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:  # installed inside: a SIGTERM that comes as it is installed does not leave it there
        signal.signal(signal.SIGTERM, handler)
        yield
    finally:
        if previous is not None:  # (None: set outside Python, and left as is)
            signal.signal(signal.SIGTERM, previous)


_state = {"jobs running": False}  # the launcher is running jobs now (it reports an interruption itself)


def handle(signals: tuple[int, ...], handler: Callable[[int, FrameType | None], object]) -> None:
    """Handle each of `signals` with `handler`, but one the program was started ignoring (SIGHUP under `nohup`; SIGINT
    for a command a script runs in the background), which stays ignored, as without hydra-ddpw."""
    for sig in signals:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)


_before_install: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}  # as before `install`
_before_passing_on: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}  # `handle_passed_on`


def handle_passed_on(handler: Callable[[int, FrameType | None], object]) -> None:
    """Handle `PASSED_ON` with `handler` in this process (but one the program was started ignoring, as `handle`). A
    fork of this process (the rank starter, and so every rank it forks) has them as before, as without hydra-ddpw: a
    rank without a handler of its own dies of one."""
    for sig in PASSED_ON:
        if _before_passing_on.setdefault(sig, signal.getsignal(sig)) != signal.SIG_IGN:
            signal.signal(sig, handler)


def _as_before_passing_on() -> None:
    """`PASSED_ON` handled as before `handle_passed_on` (in this process's fork too: the thread that forked is its main
    thread)."""
    for sig, handler in _before_passing_on.items():
        if handler is not None:  # (None: set outside Python, and left as is)
            signal.signal(sig, handler)
    _before_passing_on.clear()


os.register_at_fork(after_in_child=_as_before_passing_on)


def install() -> None:
    """Handle Ctrl-C and SIGTERM as a multirun's controller (the module docstring; main thread) until `uninstall`;
    SIGUSR1 and SIGUSR2 are passed on to the running jobs (`passing_on`)."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOPPING_SIGNALS:  # (as the program had them: not as an interrupted sweep left them, `further`)
            if _before_install.setdefault(sig, signal.getsignal(sig)) != signal.SIG_IGN:
                signal.signal(sig, _on_signal)
        handle_passed_on(_pass_on)


def uninstall() -> None:
    """The sweep is over: handle Ctrl-C and SIGTERM as before `install` (a program may go on: hydra-zen's `launch`)."""
    if threading.current_thread() is threading.main_thread():
        for sig, handler in _before_install.items():
            if handler is not None:  # (None: set outside Python, and left as is)
                signal.signal(sig, handler)
        _before_install.clear()
        _as_before_passing_on()


@contextmanager
def jobs_running() -> Iterator[None]:
    """While jobs run: the launcher reports an interruption."""
    _state["jobs running"] = True
    _raised.clear()
    try:
        yield
    finally:
        _state["jobs running"] = False


_receivers: list[Callable[[int], bool]] = []  # what passes SIGUSR1/SIGUSR2 on to the running jobs (`passing_on`)


@contextmanager
def passing_on(receiver: Callable[[int], bool]) -> Iterator[None]:
    """While jobs run: SIGUSR1 or SIGUSR2 given to the multirun's controller goes to `receiver`, which passes it on to
    the running jobs; whether any had it."""
    _receivers.append(receiver)
    try:
        yield
    finally:
        _receivers.remove(receiver)


def _pass_on(signum: int, frame: FrameType | None) -> None:
    if not any([receiver(signum) for receiver in list(_receivers)]):
        os.write(2, f"[ddpw] {named(signum)}: no job of the multirun runs here to pass it on to; nothing gets "
                    "it\n".encode())


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _state["jobs running"]:
        sys.stderr.write(nothing_running(signum))
    else:  # the launcher stops the jobs now (`further`): one more that comes before it is ready waits for it
        _raised.append(signum)
        for sig in STOPPING_SIGNALS:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, _hold_further)
    raise _stop_for(signum)


def _stop_for(signum: int) -> BaseException:
    return Interrupted() if signum == signal.SIGINT else Terminated()


_raised: list[int] = []  # the Ctrl-C or SIGTERM `_on_signal` raised while jobs ran, until the launcher's stop


def raise_dropped() -> None:
    """Called between the launcher's waits: raise again the Ctrl-C or SIGTERM `_on_signal` raised while jobs ran, which
    the code it landed in dropped (CPython loses what a handler raises inside a weakref callback, as importlib's at an
    import's end, or a garbage collector's); later ones would wait for a stop that never comes."""
    if _raised:
        raise _stop_for(_raised[0])


_further: list[int] = []  # Ctrl-Cs and SIGTERMs after the one that stops the jobs, before the launcher's stop was ready


def _hold_further(signum: int, frame: FrameType | None) -> None:
    _further.append(signum)


@contextmanager
def further(kill: Callable[[], None]) -> Iterator[None]:
    """While the launcher stops its jobs after a Ctrl-C or SIGTERM: a further one calls `kill` (at once for one before
    this block) and raises nothing, so no exception cuts the stop short. Then more are ignored: the program ends with
    the first one's exit code (one in its exit handlers would cut that short with a traceback). A program that catches
    the sweep's `Interrupted` and goes on gets its own handling back as its next sweep ends (`uninstall`)."""
    swapped = [sig for sig in STOPPING_SIGNALS if signal.getsignal(sig) in (_on_signal, _hold_further)]
    try:
        for sig in swapped:
            signal.signal(sig, lambda signum, frame: kill())
        if _further:
            kill()
        yield
    finally:
        for sig in swapped:
            signal.signal(sig, signal.SIG_IGN)
        _further.clear()
        _raised.clear()


def stopped_line(job: int, signum: int, again: bool = False) -> str:
    """The stderr line: Ctrl-C (SIGINT) or SIGTERM stopped every rank of job #`job` (`again`: the job, what of it still
    ran, was killed at once, as the signal came again)."""
    if again:
        return f"{_stopped_by(signum)}: job #{job} was killed at once, as {named(signum, short=True)} came again.\n"
    return f"{_stopped_by(signum)}: every rank of job #{job} was stopped.\n"


def killed_line(name: str, pid: int, the_programs_task: bool = False, again: bool = False) -> str:
    """The stderr line: rank `name` (`the_programs_task`: a plain run's rank 0) did not end in time and was killed
    (`again`: killed before its time was up, as the signal came again)."""
    task = ", the program's task" if the_programs_task else ""
    why = "killed at once, as the signal came again" if again else "did not end in the time it was given; killed"
    return f"[ddpw] {name} (pid {pid}{task}) {why}\n"


def stopping_line(signum: int, jobs: list[int]) -> str:
    """The stderr line: Ctrl-C (SIGINT) or SIGTERM is stopping the jobs `jobs`, and how to end them at once."""
    again = named(signum, short=True)
    numbers = ", ".join(f"#{job}" for job in jobs)
    them = "them" if len(jobs) > 1 else "it"
    return f"{_stopped_by(signum)}: stopping job {numbers}; {again} again kills {them} at once.\n"


def named(signum: int, short: bool = False) -> str:
    """How the console names a stop's signal: `Ctrl-C (SIGINT)` (`short`: `Ctrl-C`), else its name (`SIGTERM`)."""
    if signum == signal.SIGINT:
        return "Ctrl-C" if short else "Ctrl-C (SIGINT)"
    return signal.Signals(signum).name


def nothing_running(signum: int) -> str:
    """The stderr line: Ctrl-C (SIGINT) or SIGTERM came while no rank was running."""
    return f"{_stopped_by(signum)}: no rank was running.\n"


def _stopped_by(signum: int) -> str:
    return "Interrupted" if signum == signal.SIGINT else "Terminated (SIGTERM)"
