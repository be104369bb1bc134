"""What the console shows of a job's ranks (`platform.console_ranks`), whose output also lands whole in their logs: a
terminal per rank copied to the console terminal (`TerminalCopy`), or the log followed onto any other console
(`ConsoleEcho`). `freeze()` stops the console at once; later output stays in the logs (docs/architecture.md, "Console").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import select
import sys
import termios
import threading
import time
from pathlib import Path
from typing import TextIO

_CHUNK = 1 << 16
_IDLE_WAIT_S = 0.05
_TAIL = 64
"""Bytes of a followed file kept from one read to the next, where a pattern of `ConsoleEcho.until` may begin."""
_DRAIN_WAIT_S = 2.0  # a terminal copy's wait for a rank's last output (a process it started may hold the terminal)

Console = int | TextIO
"""Where console lines go: a file descriptor, or a stream without one (a notebook's `sys.stdout`)."""


def console_of(stream: TextIO) -> Console:
    """`stream`'s file descriptor, or the stream itself when it has none."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return stream


class _Lines:
    """One rank's output on the console: as it comes, or whole lines after `prefix` (ranks' lines do not mix), a line
    rewritten with '\r' (a progress bar) as its last state, which a '\r' after the prefix would overwrite; `end()` ends
    a line the rank left open (a `printf` without a newline), so the console's next starts its own."""

    def __init__(self, console: Console, prefix: str) -> None:
        self.console = console
        self.prefix = prefix.encode()
        self.partial = b""  # the open line: with a prefix, held back; without one, its last byte (already written)

    def write(self, data: bytes) -> None:
        if not self.prefix:
            _write_all(self.console, data)
            self.partial = b"" if data.endswith(b"\n") else data[-1:]
            return
        lines = (self.partial + data).split(b"\n")
        head, rewritten, self.partial = lines.pop().rpartition(b"\r")  # (its last two states: the last may be empty)
        self.partial = head.rpartition(b"\r")[2] + rewritten + self.partial
        if lines:
            _write_all(self.console, b"".join(self.prefix + _last_state(line) + b"\n" for line in lines))

    def end(self) -> None:
        if self.partial:
            _write_all(self.console, (self.prefix + _last_state(self.partial) if self.prefix else b"") + b"\n")
            self.partial = b""


def _last_state(line: bytes) -> bytes:
    """What a terminal shows of `line` rewritten with '\r': its last state (a '\r' that ends it, as a terminal's line
    ending has, rewrites nothing)."""
    return line.rstrip(b"\r").rpartition(b"\r")[2]


def show(text: str, stream: TextIO) -> None:
    """Print `text`, a line of hydra-ddpw's own, to `stream` (stdout). When its reader is gone (`| head`, `less` quit),
    the rest goes nowhere, as Python advises, and the job goes on (its logs and summary file keep it). The line and its
    end go in one write: `print` writes them apart, and on an unbuffered stdout (a job process's) a line that a job
    beside it echoed landed between the two."""
    try:
        stream.write(f"{text}\n")
        stream.flush()
    except OSError:  # BrokenPipeError; EIO for a terminal that closed
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _write_all(console: Console, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):  # a console that went away: the log still gets everything
        if isinstance(console, int):
            while data:
                data = data[os.write(console, data):]
        else:
            console.write(data.decode("utf-8", "backslashreplace"))
            console.flush()


class ConsoleEcho:
    """Follows log files onto the console in bounded chunks, each rank's lines after its prefix in `prefixes`; a rank
    with a pattern in `until` up to the line that it matches (the pattern starts with that line's newline)."""

    def __init__(self, files: dict[int, Path], console: Console, prefixes: dict[int, str],
                 until: dict[int, re.Pattern[bytes]] | None = None) -> None:
        self.files = files
        self.until = until or {}
        self._tails = {rank: b"\n" for rank in self.until}  # the end of what was read: a match may begin in it
        self._ended: set[int] = set()
        self._lines = {rank: _Lines(console, prefixes.get(rank, "")) for rank in files}
        self._offsets = {rank: file_size(path) for rank, path in files.items()}  # earlier runs are not repeated
        self._lock = threading.Lock()
        self._frozen = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="ddpw-console", daemon=True)

    def start(self) -> None:
        """Start following."""
        if self.files:
            self._thread.start()

    def freeze(self) -> None:
        """Copy what the files hold now, then stop copying."""
        self._copy_all({rank: file_size(path) for rank, path in self.files.items()})

    def stop(self) -> None:
        """Copy what is left (unless frozen) and stop following."""
        if self._thread.is_alive():
            self._stopping.set()
            self._thread.join()
        self._copy_all(None)

    def _copy_all(self, limits: dict[int, int] | None) -> None:
        """Unless frozen, copy each file up to its size in `limits` (None: to its end), then freeze."""
        with self._lock:
            if self._frozen:
                return
            for rank in self.files:
                while self._copy(rank, None if limits is None else limits[rank]):
                    pass
                self._lines[rank].end()
            self._frozen = True

    def _follow(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                progressed = not self._frozen and any([self._copy(rank, None) for rank in self.files])
            if not progressed:
                self._stopping.wait(_IDLE_WAIT_S)

    def _copy(self, rank: int, limit: int | None) -> bool:
        offset = self._offsets[rank]
        size = _CHUNK if limit is None else min(_CHUNK, limit - offset)
        if size <= 0 or rank in self._ended:
            return False
        try:
            with open(self.files[rank], "rb") as src:
                src.seek(offset)
                data = src.read(size)
        except FileNotFoundError:
            return False
        if not data:
            return False
        self._offsets[rank] += len(data)
        if rank in self.until:
            seen = self._tails[rank] + data
            if (end := self.until[rank].search(seen)) is not None:
                self._ended.add(rank)
                data = data[:max(0, end.start() + 1 - len(self._tails[rank]))]
            self._tails[rank] = seen[-_TAIL:]
        self._lines[rank].write(data)
        return True


def _raw(fd: int) -> None:
    """Make terminal `fd` raw for output, as `tty.setraw` does (`termios` only: a user's `tty.py` beside the script
    shadows the standard library's): bytes pass as written, the console terminal translates them."""
    attributes = termios.tcgetattr(fd)
    attributes[1] &= ~termios.OPOST
    attributes[3] &= ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG)
    termios.tcsetattr(fd, termios.TCSAFLUSH, attributes)


class _Copy:
    """What a process writes into (`writer`: its fds 1 and 2), appended to `log_file` and copied to a console by a
    thread of this process; `handed_over` once the writer holds it, so the copy ends when the writer's end closes."""

    def __init__(self, log_file: Path, writer: int) -> None:
        self.writer = writer
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def handed_over(self) -> None:
        """The writer holds it now: close this process's end, so the copy ends when the writer's do."""
        if self.writer >= 0:
            os.close(self.writer)
            self.writer = -1


class TerminalCopy(_Copy):
    """A pseudo-terminal for one rank's output (`writer`: its fds 1 and 2), copied to the console and the log."""

    def __init__(self, log_file: Path, console_fd: int, prefix: str) -> None:
        self.master_fd, slave_fd = os.openpty()
        super().__init__(log_file, slave_fd)
        _raw(slave_fd)
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(console_fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(slave_fd, termios.TIOCSWINSZ, size)
        os.set_blocking(self.master_fd, False)  # the thread waits in `select`; `freeze` reads what is there
        self._lines = _Lines(console_fd, prefix)
        self._lock = threading.Lock()  # held while output is copied: `freeze` copies what is left, then stops
        self._frozen = threading.Event()
        self._thread = threading.Thread(target=self._copy, name="ddpw-terminal", daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        """Copy to the console what the rank wrote so far, then stop copying there (the log still gets everything)."""
        deadline = time.monotonic() + _DRAIN_WAIT_S  # a rank that keeps writing does not hold the freeze
        with self._lock:
            while time.monotonic() < deadline and self._copy_available():
                pass
            if not self._frozen.is_set():
                self._lines.end()
            self._frozen.set()

    def stop(self) -> None:
        """Wait (at most `_DRAIN_WAIT_S`) until everything the rank wrote is copied, then close."""
        self.handed_over()
        self._thread.join(_DRAIN_WAIT_S)
        self._frozen.set()
        self._thread.join(_DRAIN_WAIT_S)
        if not self._thread.is_alive():
            os.close(self.master_fd)
            os.close(self._log_fd)

    def _copy(self) -> None:
        try:
            while True:
                select.select([self.master_fd], [], [])  # readable: output, or every holder closed the rank's side
                with self._lock:
                    if self._copy_available() is None:
                        return
        finally:
            with self._lock:
                if not self._frozen.is_set():
                    self._lines.end()

    def _copy_available(self) -> bool | None:
        """Copy one chunk of the rank's output: whether there was one; None once every holder closed its side."""
        try:
            data = os.read(self.master_fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError as exc:  # EIO: every holder of the rank's side has closed it
            if exc.errno != errno.EIO:
                raise
            return None
        if not data:
            return None
        _write_all(self._log_fd, data)
        if not self._frozen.is_set():
            self._lines.write(data)
        return True


class PipeCopy(_Copy):
    """A pipe (`writer`) copied to `console_fd` and appended to `log_file`, as `TerminalCopy` copies a terminal, for a
    console that is not one (a file, a pipe): what the process that writes into it prints reaches both."""

    def __init__(self, log_file: Path, console_fd: int) -> None:
        self.read_fd, write_fd = os.pipe()
        super().__init__(log_file, write_fd)
        self._console_fd = os.dup(console_fd)
        self._thread = threading.Thread(target=self._copy, name="ddpw-output-copy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wait (at most `_DRAIN_WAIT_S`) until everything written is copied, then close."""
        self.handed_over()
        self._thread.join(_DRAIN_WAIT_S)
        if not self._thread.is_alive():
            for fd in (self.read_fd, self._log_fd, self._console_fd):
                os.close(fd)

    def _copy(self) -> None:
        """Each chunk to the console as it comes; to the log whole lines (a partial one once its line ends, or it grows
        past a chunk), so that the other stream's copy into the same log never lands inside one of this stream's."""
        pending = b""
        while data := os.read(self.read_fd, _CHUNK):
            _write_all(self._console_fd, data)
            pending += data
            cut = pending.rfind(b"\n") + 1 if len(pending) < _CHUNK else len(pending)
            _write_all(self._log_fd, pending[:cut])
            pending = pending[cut:]
        _write_all(self._log_fd, pending)


def copied_output(log_file: Path) -> list[TerminalCopy | PipeCopy]:
    """A copy of this process's fds 1 and 2 each (a terminal's for a terminal, a pipe's for anything else) that also
    appends to `log_file`: what writes into them reaches this process's console and the log. One for both when both
    are the same terminal."""
    copies: list[TerminalCopy | PipeCopy] = []
    for fd in (1, 2):
        if fd == 2 and copies and isinstance(copies[0], TerminalCopy) and os.isatty(2) and _same_file(1, 2):
            copies.append(copies[0])
        else:
            copies.append(TerminalCopy(log_file, fd, "") if os.isatty(fd) else PipeCopy(log_file, fd))
    return copies


def _same_file(fd: int, other: int) -> bool:
    one, two = os.fstat(fd), os.fstat(other)
    return (one.st_dev, one.st_ino, one.st_rdev) == (two.st_dev, two.st_ino, two.st_rdev)


class ConsoleRanks:
    """The console of one node's job: `job_prefix` before every line (jobs side by side), `[rank k]` too if `ranked`."""

    def __init__(self, log_files: dict[int, Path], job_prefix: str = "", ranked: bool = False) -> None:
        console = console_of(sys.stdout)
        # A copy of the console's fd: this process's own may be redirected later (a plain run's rank 0 takes it over).
        self._own_fd = os.dup(console) if isinstance(console, int) and log_files else None
        console = self._own_fd if self._own_fd is not None else console
        prefixes = {rank: job_prefix + (f"[rank {rank}] " if ranked else "") for rank in log_files}
        tty_fd = console if isinstance(console, int) and os.isatty(console) else None
        self.terminals = {rank: TerminalCopy(path, tty_fd, prefixes[rank])
                          for rank, path in log_files.items() if tty_fd is not None}
        self.echo = ConsoleEcho({} if tty_fd is not None else log_files, console, prefixes)
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()

    def terminal_of(self, rank: int) -> int | None:
        """The descriptor that rank `rank` writes its output to, when it gets a terminal."""
        return copy.writer if (copy := self.terminals.get(rank)) is not None else None

    def handed_over(self, rank: int) -> None:
        """Rank `rank` has started with its terminal."""
        if (copy := self.terminals.get(rank)) is not None:
            copy.handed_over()

    def __enter__(self) -> ConsoleRanks:
        self.echo.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def freeze(self) -> None:
        """Stop showing the ranks' output (see the module docstring)."""
        self.echo.freeze()
        for copy in self.terminals.values():
            copy.freeze()

    def stop(self) -> None:
        """Show what is left (unless frozen) and stop."""
        self.echo.stop()
        for copy in self.terminals.values():
            copy.stop()
        self.terminals = {}
        if self._own_fd is not None:
            os.close(self._own_fd)
            self._own_fd = None


def file_size(path: Path) -> int:
    """Current size of `path` (0 when absent)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
