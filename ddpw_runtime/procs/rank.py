"""What runs in each rank process: output to its log file, the launching process's state, logging, device, process
group and seed, then the task; it always ends by writing a `RankResult`. Run as `python -m ddpw_runtime.procs.rank
PAYLOAD LOCAL_RANK LISTEN_FD TERMINAL_FD` (spawn; `-` for a descriptor it does not get) or by the starter after fork."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import io
import itertools
import math
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, cast

from ddpw_runtime import _compat
from ddpw_runtime.launch.payload import RankPayload, TaskCall, from_task, write_atomically
from ddpw_runtime.launch.pickling import dumps
from ddpw_runtime.launch.plan import DUMP_SIGNAL, recorder_file, stacks_file
from ddpw_runtime.launch.records import RankResult
from ddpw_runtime.rank import recorder
from ddpw_runtime.rank.environment import rank_environment, tell_imported_libraries
from ddpw_runtime.rank.own_process import flush_output, left_open, open_log
from ddpw_runtime.rank.setup import setup_rank
from ddpw_runtime.rank.task_init import explained


def run_rank(payload_path: str, local_rank: int, terminal: int | None = None,
             join_job: Callable[[int], None] | None = None) -> int:
    """Run one rank; the process exit code (0: the task returned, 1: it raised). `terminal`: a console rank's
    terminal, when the console is one (its output goes there, and from there to its log). `join_job(0)` makes this
    process one of its job's (`JobProcesses.adopt`); it waits on the kernel (5-15 ms), so it runs on a thread while
    torch is set up, and has returned before any of the task's code runs (logging handlers, unpickling, the task)."""
    # SIGTERM stops a rank unless its task installs a handler, even where the starter ignores it (a SLURM node).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    inherited = len(sys.modules)
    joining = threading.Thread(target=join_job, args=(0,), name="ddpw-join-job") if join_job else None
    if joining is not None:
        joining.start()
    payload: RankPayload = pickle.loads(Path(payload_path).read_bytes())
    plan = payload.plan
    rank = plan.node_rank * plan.ranks_per_node + local_rank
    _redirect_output(plan.log_file(rank), terminal)
    recorder.arm(recorder_file(plan.log_dir, rank))
    signal.signal(DUMP_SIGNAL, recorder.on_request)  # its collectives, after faulthandler's stacks (chain)
    stacks = open_log(stacks_file(plan.log_dir, rank))
    recorder.keep_stacks(lambda: faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=True))
    # What the task forks (DataLoader workers, asked where they are by `hangs`) dumps the thread the signal comes to
    # only: reading the other threads' stacks as they run (a worker's queue feeder) crashed a busy forked worker now
    # and then (SIGSEGV: 10 in 28,595 requests in a stress run; none in 30,000 with one thread), failing its DataLoader.
    os.register_at_fork(after_in_child=lambda: recorder.keep_stacks(
        lambda: faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=False, chain=True)))
    try:
        try:
            signal.signal(signal.SIGINT, _interrupted_in_set_up)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held by the starter until now
            state = payload.state
            state.enter({**rank_environment(plan, rank, local_rank, state.env), **payload.job_environment()})
            if plan.share is not None and plan.share.cpus:
                os.sched_setaffinity(0, plan.share.cpus)  # its job's cores, before any thread pool starts
            tempfile.tempdir = None  # the job's own TMPDIR from now on, even if the starter had asked before
            tell_imported_libraries(rank)
            setup_rank(plan, rank, local_rank)
            if joining is not None:
                joining.join()
            configure_logging(rank)
            task: TaskCall = pickle.loads(payload.task)
            before_task = len(sys.modules)
            _task_may_start()
            payload.task_mark(rank).touch(0o600)
            gc.freeze()  # what the task makes from now on is what `_end_as_python_does` looks through
            _compat.disown_finalizers()  # (the controller's and the starter's)
            value = task()
        finally:
            held = _hold_stops()  # the task is over: its result is written whole before the job's stop takes it
        result = RankResult.success(rank, value, _loaded_since(before_task))
    except SystemExit as exc:  # `sys.exit()` in a task: success for status 0 or None
        if exc.code in (0, None):
            result = RankResult(rank, exited=f"its task called sys.exit({'' if exc.code is None else exc.code!r})")
        else:
            result = RankResult.failure(rank, from_task(exc))
    except BaseException as exc:  # every failure goes back to the controller
        result = RankResult.failure(rank, explained(from_task(exc)))
    result.imported = _torch_modules_imported(inherited)
    # The result is on disk before this rank's connections close: when its peers fail on them, the controller
    # already knows this rank failed first.
    write_atomically(payload.result_file(rank), dumps(result))
    recorder.after(result)  # after the result: a rank stopped meanwhile is still known to have waited
    _let_stops_through(held)
    # The process group is not torn down: the process's end closes its connections, and destroying it first only
    # adds gloo's wait for its I/O threads (~20 ms with 2 ranks) to every job.
    _end_as_python_does(result.ok, plan.platform.exit_timeout_min)
    flush_output()
    return 0 if result.ok else 1


def _end_as_python_does(returned: bool, timeout_min: float) -> None:
    """What Python does as it exits, which the rank's `os._exit` skips: the `atexit` handlers registered in the rank
    (the starter dropped its own), logging's flush, and closing the files the task left open. A failed task's rank
    (not `returned`) runs no handler: the job learns of the failure as the rank ends and stops the others at once (a
    tracker's upload would hold that up). Bounded by `timeout_min` (`platform.exit_timeout_min`): then the kernel's
    alarm (SIGALRM) ends the rank, its threads' stacks in its log (not faulthandler's `dump_traceback_later`: a fork of
    a process that had armed it waits for ever for that process's watchdog thread). Threads the task left running are
    not waited for."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    faulthandler.register(signal.SIGALRM, file=sys.stderr, all_threads=True, chain=True)
    signal.alarm(min(math.ceil(timeout_min * 60), 2**31 - 1))  # (a C int: 68 years, below the 100 it may be)
    if returned:
        _compat.run_exit_handlers()
        _compat.run_finalizers()  # (weakref's own exit handler, registered before the fork, was dropped there)
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for file in left_open():  # what they hold back reaches the disk
        with contextlib.suppress(Exception):
            file.close()
    signal.alarm(0)


_Handler = Callable[[int, FrameType | None], Any] | int | None
"""A signal's handler, as `signal.signal` takes and returns it."""
_stops: list[int] = []
"""The SIGTERMs (the job's stop) that came while the rank's result was being written."""
_interrupts: list[int] = []
"""The Ctrl-Cs that came while the rank set up."""


def _interrupted_in_set_up(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the rank sets up: note it, raise KeyboardInterrupt. Set-up code may drop it (an import that catches
    everything, a callback from torch's C++ code), and the rank would go on into its task deaf to the job's interrupt,
    the job waiting its whole grace: `_task_may_start` raises it again."""
    _interrupts.append(signum)
    raise KeyboardInterrupt


def _task_may_start() -> None:
    """Python's own Ctrl-C handler from now on, and KeyboardInterrupt now if one came during set-up."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupts:
        raise KeyboardInterrupt


def _hold_stops() -> _Handler:
    """Make a SIGTERM wait until `_let_stops_through` (a handler, not a mask: the kernel gives a process's signal to
    any thread); the handler it replaces. A rank whose collective timed out may spend seconds between its task's end
    and its result (traceback formatted, DataLoader workers joined): stopped meanwhile, it never said it waited."""
    return signal.signal(signal.SIGTERM, lambda signum, frame: _stops.append(signum))


def _let_stops_through(previous: _Handler) -> None:
    """Put `previous` back as SIGTERM's handler; a SIGTERM that came meanwhile reaches it now."""
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    if _stops:
        signal.raise_signal(signal.SIGTERM)


def _loaded_since(count: int) -> set[str]:
    """The modules loaded since `sys.modules` held `count` entries (its newest; a module removed meanwhile leaves one
    out). Only those are read: reading a name writes its refcount, copying in a forked rank every page holding one."""
    return set(itertools.islice(reversed(sys.modules), max(len(sys.modules) - count, 0)))


def _torch_modules_imported(inherited: int) -> tuple[str, ...]:
    """The torch modules loaded since this process started (with `inherited` loaded), for the starter to preload. None
    with a GPU build of torch (CUDA, ROCm), where more imports in the starter could initialise the GPU runtime."""
    torch = sys.modules.get("torch")
    if torch is None or torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return ()
    return tuple(sorted(name for name in _loaded_since(inherited) if name.startswith("torch.")))


def _redirect_output(log_file: Path, terminal: int | None) -> None:
    """Send fds 1 and 2 (Python and C/C++ output) to the rank's log file (or terminal), unbuffered at every level (as
    `python -u`, C's stdout too), so nothing written before the process ends, even by `os._exit`, is lost. Input is
    /dev/null: only a rank in the user's own process reads the user's terminal."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = terminal if terminal is not None else open_log(log_file)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                               errors="backslashreplace", write_through=True) for fd in (1, 2))
    with contextlib.suppress(OSError, AttributeError, ValueError):  # C's stdout, fully buffered on a file
        found = ctypes.CDLL(None)
        found.setvbuf(ctypes.c_void_p.in_dll(found, "stdout"), None, 2, 0)  # 2: _IONBF
    faulthandler.enable(file=sys.stderr)


def configure_logging(rank: int) -> None:
    """Configure logging as Hydra did in the launching process (its own, then the job's), for a Hydra job. Ranks but 0
    leave out the job's file handlers, so the job log gets each line once (their records reach their own log through
    the console handlers); rank 0 appends to the job's files (`mode: w` too), as the job's own process does."""
    if "hydra" not in sys.modules:  # no Hydra job: the launching process had no Hydra state to pass on
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log
    from omegaconf import DictConfig, OmegaConf

    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.get()
    configure_log(cast(DictConfig, hydra.hydra_logging), hydra.verbose)
    job_logging: Any = OmegaConf.to_container(hydra.job_logging, resolve=True) if hydra.job_logging else None
    if isinstance(job_logging, dict) and rank != 0:
        _drop_file_handlers(job_logging)
    elif isinstance(job_logging, dict):  # the job's process has the file open too: both append to it
        for handler in (job_logging.get("handlers") or {}).values():
            if isinstance(handler, dict) and handler.get("mode") == "w":
                handler["mode"] = "a"
    configure_log(cast(DictConfig, OmegaConf.create(job_logging) if job_logging else None), hydra.verbose)


def _drop_file_handlers(logging_config: dict[str, Any]) -> None:
    """Remove the handlers that write to a file (any `logging.FileHandler`, or given a `filename`) from a
    `logging.config` dictionary, and every reference to them."""
    handlers = logging_config.get("handlers") or {}
    files = [name for name, handler in handlers.items() if _writes_a_file(handler)]
    for name in files:
        del handlers[name]
    for logger in [logging_config.get("root") or {}, *(logging_config.get("loggers") or {}).values()]:
        if isinstance(logger, dict) and "handlers" in logger:
            logger["handlers"] = [h for h in logger["handlers"] if h not in files]


def _writes_a_file(handler: Any) -> bool:
    import logging
    import pydoc

    if not isinstance(handler, dict):
        return False
    if "filename" in handler:
        return True
    cls = pydoc.locate(str(handler.get("class") or handler.get("()") or ""))
    return isinstance(cls, type) and issubclass(cls, logging.FileHandler)


if __name__ == "__main__":
    # The rank ends with its task, as a forked one does: a non-daemon thread left running does not keep it.
    os._exit(run_rank(sys.argv[1], int(sys.argv[2]), None if sys.argv[3] == "-" else int(sys.argv[3])))
