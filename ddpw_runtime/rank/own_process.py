"""A rank in a process not started as one (rank 0 of a plain run, or of `Wrapper(caller_rank=True)`): for its task
the process takes on the rank's variables, output and process group, and afterwards is as it was (environment,
output, thread count, excepthook, temporary folder)."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ddpw_runtime import _compat
from ddpw_runtime.launch.bounds import IMPORT_HOLD_S
from ddpw_runtime.launch.plan import LaunchPlan, recorder_file

if TYPE_CHECKING:
    from ddpw_runtime.launch.records import RankResult


class RankInThisProcess:
    """This process as rank 0 of `plan`'s job, taking on the variables `env`; `output`: where fds 1 and 2 go while
    it is a rank (a terminal of its own, or its log file; None: they stay)."""

    def __init__(self, plan: LaunchPlan, env: Mapping[str, str], output: int | None = None) -> None:
        self.plan = plan
        self.env = dict(env)
        self.output = output
        self._saved_env: dict[str, str | None] = {}
        self._saved_fds: tuple[int, int] | None = None
        self._saved_threads: int | None = None  # set while this process is in the job (from its joining on)
        self._saved_excepthook = sys.excepthook
        self._faulthandler = faulthandler.is_enabled()

    def enter(self) -> None:
        """Take on the rank's variables and output, and join the job; on failure, put the process back first."""
        self._saved_env = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        tempfile.tempdir = None  # the job's own TMPDIR, when the variables name one
        if self.output is not None:
            flush_output()
            self._saved_fds = (os.dup(1), os.dup(2))
            os.dup2(self.output, 1)
            os.dup2(self.output, 2)
            os.close(self.output)
            self.output = None
            faulthandler.enable()  # a crash leaves its Python stack in the rank's log, as in every rank
        try:
            import torch

            from ddpw_runtime.rank import recorder
            from ddpw_runtime.rank.environment import tell_imported_libraries
            from ddpw_runtime.rank.setup import setup_rank

            self._saved_threads = torch.get_num_threads()
            tell_imported_libraries(0)
            recorder.arm(recorder_file(self.plan.log_dir, 0), asked=False)
            setup_rank(self.plan, 0, 0)
        except BaseException:
            self.leave()
            raise

    def leave(self, ended: RankResult | None = None, *, stopped: bool = False) -> None:
        """The task ended (as `ended`, when it ran; `stopped`: by the job's stop): leave the group and put the process
        back. Output buffers are flushed before the group goes (its peers then fail and the console stops showing the
        job). The flight recorder is dumped first when the task failed or was stopped: the supervisor took its stacks
        without it, and a stop that lands as its own collective times out takes the place of that timeout."""
        if self._saved_fds is not None:
            flush_output()
        if self._saved_threads is not None:
            import torch

            from ddpw_runtime.rank import recorder
            from ddpw_runtime.rank.setup import teardown_rank

            if stopped:
                recorder.dump()
            elif ended is not None:
                recorder.after(ended)
            recorder.arm(None)
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
            teardown_rank()
            sys.excepthook = self._saved_excepthook  # init_process_group installs a `[rank0]` one
        if self._saved_fds is not None:
            flush_output()  # what the teardown wrote
            if not self._faulthandler:
                faulthandler.disable()
            for fd, saved in zip((1, 2), self._saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            self._saved_fds = None
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}
        tempfile.tempdir = None


def on_stack(frame: FrameType | None, codes: Container[CodeType]) -> bool:
    """Whether `frame`, or a frame that called it, runs one of `codes`."""
    return frame is not None and any(f.f_code in codes for f, _ in traceback.walk_stack(frame))


IMPORT_POLL_S = 0.01
"""How often `ImportHold` looks whether the import it waits for has ended."""


class ImportHold:
    """Holds a stop that comes while the main thread imports a module until the import ends (at most `IMPORT_HOLD_S`):
    raised inside it, the stop leaves the modules it had begun half made in this process (a package without the
    submodules it had imported: `module 'sympy' has no attribute 'printing'` as DDP imports torch._dynamo again), and
    this process runs rank 0's task again when the job restarts. `resend` sends the stop's signal to the main thread."""

    def __init__(self, resend: Callable[[], None]) -> None:
        self.resend = resend
        self._due = threading.Event()
        self._waiting: threading.Thread | None = None

    def holds(self, frame: FrameType | None) -> bool:
        """Whether the stop that came at `frame` (the main thread's) waits: its signal comes again after the import."""
        if self._due.is_set() or not _importing(frame):
            self._due.clear()
            return False
        if self._waiting is None or not self._waiting.is_alive():
            self._waiting = threading.Thread(target=self._resend_after_import, name="ddpw-import-hold", daemon=True)
            self._waiting.start()
        return True

    def _resend_after_import(self) -> None:
        end = time.monotonic() + IMPORT_HOLD_S
        while _importing(_compat.main_thread_frame()) and time.monotonic() < end:
            time.sleep(IMPORT_POLL_S)
        self._due.set()
        self.resend()


def _importing(frame: FrameType | None) -> bool:
    code = _compat.import_code()
    return code is not None and on_stack(frame, (code,))


def open_log(log_file: Path) -> int:
    """A descriptor that appends to a rank's log file (made if missing)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    return os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def left_open() -> list[Any]:
    """The files the task made (since the heap was frozen) and left open, outermost only (a text file, not the buffer
    it closes itself); never this process's own output."""
    return _outermost(_compat.open_files(gc.get_objects()))


def _outermost(files: list[Any]) -> list[Any]:
    """Those of `files` that no other file (nor this process's output) holds, never this process's output."""
    inner = {id(held) for file in [*files, sys.stdout, sys.stderr] for referent in gc.get_referents(file)
             for held in (referent.values() if isinstance(referent, dict) else (referent,))}
    return [file for file in files if id(file) not in inner and file not in (sys.stdout, sys.stderr)]


def flush_left_open() -> None:
    """Flush the files left open (`left_open`): not closed, since an exit handler that runs later may still write. But
    a file written over another in Python (gzip, bz2, lzma) is closed: only that writes its end."""
    files = _compat.open_files(gc.get_objects())
    for file in _outermost(files):
        with contextlib.suppress(Exception):
            file.flush()
    for file in files:
        if type(file).__module__ != "_io":
            with contextlib.suppress(Exception):
                file.close()


def end_frozen() -> None:
    """As a process ends, once the exit handlers registered after this one ran: flush the files left open
    (`flush_left_open`), then freeze the heap, so that the interpreter's last garbage collections do not walk it (0.4 to
    0.7 s with torch loaded, on 2 cores). Objects are still freed by their reference counts as Python ends; only those
    in reference cycles are left to the process's end, as Python allows (a rank leaves everything to it: `os._exit`)."""
    flush_left_open()
    gc.freeze()


def flush_output() -> None:
    """Flush Python's and the C library's output buffers (a closed `sys.stdout` is skipped)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            stream.flush()
    with contextlib.suppress(OSError):  # no C library to load
        ctypes.CDLL(None).fflush(None)
