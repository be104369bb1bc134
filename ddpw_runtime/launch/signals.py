"""Signals to ranks: each rank leads its own process group, so a signal to the group reaches what the
rank started too."""

from __future__ import annotations

import os


def send_to_group(pid: int, sig: int, group: bool = True) -> None:
    """Send `sig` to the process group led by `pid` (with `group`), or to `pid` alone; a process that is
    already gone is not an error."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
