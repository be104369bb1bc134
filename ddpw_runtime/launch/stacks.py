"""Reading the Python stack dumps that ranks write into their logs (faulthandler, on SIGUSR1)."""

from __future__ import annotations

import re
from pathlib import Path
from types import FrameType

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)$')
_FRAMES_SHOWN = 3


def where(log_file: Path) -> str:
    """Where the rank was, from the last stack dump in `log_file`: the innermost frames of the thread
    that got the dump signal (the main thread of a busy rank); 'no stack dump' when there is none."""
    try:
        lines = log_file.read_text(errors="backslashreplace").splitlines()
    except FileNotFoundError:
        return "no log file"
    starts = [i for i, line in enumerate(lines) if _THREAD.match(line)]
    if not starts:
        return "no stack dump (the rank had exited or could not be interrupted)"
    dump = [starts[-1]]  # the last dump: thread blocks with only frames and blank lines between
    for start in reversed(starts[:-1]):
        if not all(not line.strip() or _FRAME.match(line) for line in lines[start + 1:dump[0]]):
            break
        dump.insert(0, start)
    chosen = next((i for i in dump if lines[i].startswith("Current thread")), dump[0])
    frames: list[str] = []
    for line in lines[chosen + 1:]:
        match = _FRAME.match(line)
        if not match:
            break
        frames.append(f"{match['func']} ({match['file']}:{match['line']})")
    return " <- ".join(frames[:_FRAMES_SHOWN]) or "no Python frame"


def where_in(frame: FrameType | None) -> str:
    """Where a live thread is, given its innermost frame, written as `where` writes a dump."""
    frames: list[str] = []
    while frame is not None and len(frames) < _FRAMES_SHOWN:
        code = frame.f_code
        frames.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        frame = frame.f_back
    return " <- ".join(frames) or "no Python frame"
