"""Echoes the log files of the console ranks to the console while the ranks run."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Dict, List, TextIO

_CHUNK = 1 << 16
_IDLE_WAIT_S = 0.05


class ConsoleEcho:
    """Follows rank log files and copies each complete line to `out`, prefixed with `[rank k]` when
    more than one rank is shown. Reads in bounded chunks, so memory does not grow with the output;
    `stop()` copies whatever is left, so nothing written before the ranks ended is missed."""

    def __init__(self, files: Dict[int, Path], out: TextIO = sys.stdout) -> None:
        self.files = files
        self.out = out
        self.prefixed = len(files) > 1
        self._offsets = {rank: _size(path) for rank, path in files.items()}
        self._partial: Dict[int, bytes] = {rank: b"" for rank in files}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="ddpw-console", daemon=True)

    def __enter__(self) -> "ConsoleEcho":
        if self.files:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Copy what is left and stop following."""
        if self._thread.is_alive():
            self._stopping.set()
            self._thread.join()
        for rank in self.files:
            while self._copy(rank):
                pass
            if self._partial[rank]:
                self._emit(rank, [self._partial[rank]])
                self._partial[rank] = b""
        self.out.flush()

    def _follow(self) -> None:
        while not self._stopping.is_set():
            progressed = False
            for rank in self.files:
                progressed |= self._copy(rank)
            if not progressed:
                self._stopping.wait(_IDLE_WAIT_S)

    def _copy(self, rank: int) -> bool:
        try:
            with open(self.files[rank], "rb") as src:
                src.seek(self._offsets[rank])
                data = src.read(_CHUNK)
        except FileNotFoundError:
            return False
        if not data:
            return False
        self._offsets[rank] += len(data)
        lines = (self._partial[rank] + data).split(b"\n")
        self._partial[rank] = lines.pop()
        self._emit(rank, lines)
        return True

    def _emit(self, rank: int, lines: List[bytes]) -> None:
        prefix = f"[rank {rank}] " if self.prefixed else ""
        text = "".join(f"{prefix}{line.decode('utf-8', 'backslashreplace')}\n" for line in lines)
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):
            pass


def _size(path: Path) -> int:
    """Current size of `path` (0 when absent): echo starts there, so earlier runs are not repeated."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
