"""Every process of one job on this node, however started (also in a session of its own), and how to stop them all:
the job's cgroup where one can be made, else the processes whose environment names the job (`DDPW_JOB`). Stopping gives
SIGTERM and a moment (for `multiprocessing`'s resource tracker to clean /dev/shm), then SIGKILL; every wait is bounded
(docs/faults.md, "What "nothing is left" covers")."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ddpw_runtime.launch.bounds import KILL_WAIT_S, TERM_WAIT_S
from ddpw_runtime.launch.payload import JOB_ENV
from ddpw_runtime.launch.signals import send_to_group

_POLL_S = 0.01


def _make_cgroup() -> Path | None:
    """A new cgroup (v2) below this process's own, or None; empty ones a killed rank starter left are removed first."""
    try:
        line = next(line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for mount in mounts:
        fields = mount.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            parent = Path(fields[4]) / line[3:].lstrip("/")
            for stale in parent.glob("ddpw-*-*"):
                if not _alive(int(stale.name.split("-")[1])):
                    with contextlib.suppress(OSError):  # (one that is not empty stays)
                        stale.rmdir()
            try:  # a name no other cgroup has (a pid is reused; a cgroup of a killed starter may be left)
                return Path(tempfile.mkdtemp(prefix=f"ddpw-{os.getpid()}-", dir=parent))
            except OSError:
                return None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def processes(matches: Callable[[Path], bool]) -> set[int]:
    """The pids whose `/proc` entry `matches` (not those gone meanwhile, zombies, or another user's unreadable ones)."""
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if entry.name.isdigit() and matches(entry):
                found.add(int(entry.name))
    return found


def children_of_this_process() -> set[int]:
    """This process's children: from `/proc/self/task/*/children`, else (no CONFIG_PROC_CHILDREN) every one's parent."""
    try:
        tasks = Path("/proc/self/task").iterdir()
        return {int(pid) for task in tasks for pid in (task / "children").read_text().split()}
    except OSError:
        me = os.getpid()
        return processes(lambda entry: int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me)


class JobProcesses:
    """The processes of job `key` on this node, made in the rank starter (never counting it or the launching one)."""

    def __init__(self, key: str, cgroup: bool = True) -> None:
        self.key = key
        self.cgroup = _make_cgroup() if cgroup else None
        self.spared = {os.getpid(), os.getppid()}

    def adopt(self, pid: int) -> None:
        """Put `pid` (0: the calling one) into the job's cgroup (if any), so what it starts is the job's."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.procs").write_text(str(pid))

    def release(self, pid: int) -> None:
        """Let an adopted `pid` go (back to the parent cgroup), never counted as the job's, so a stop spares it."""
        self.spared.add(pid)
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup.parent / "cgroup.procs").write_text(str(pid))

    def members(self) -> set[int]:
        """The job's live processes: its cgroup's, or those whose environment names the job."""
        if self.cgroup is not None:
            try:
                return {int(pid) for pid in (self.cgroup / "cgroup.procs").read_text().split()} - self.spared
            except OSError:
                return set()
        marker = f"{JOB_ENV}={self.key}".encode()
        return processes(lambda entry: marker in (entry / "environ").read_bytes().split(b"\0")) - self.spared

    def stop(self) -> list[int]:
        """Stop every process of the job (SIGTERM, a moment, SIGKILL), remove its cgroup; the pids still there."""
        for sig, wait_s in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, KILL_WAIT_S)):
            left = self._signal(sig)
            end = time.monotonic() + wait_s
            while left and time.monotonic() < end:
                time.sleep(_POLL_S)
                left = self.members()
            if not left:
                break
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        return sorted(left)

    def _signal(self, sig: int) -> set[int]:
        members = self.members()
        if self.cgroup is not None and sig == signal.SIGKILL:
            with contextlib.suppress(OSError):  # no cgroup.kill before Linux 5.14
                (self.cgroup / "cgroup.kill").write_text("1")
                return members
        for pid in members:
            send_to_group(pid, sig)
            send_to_group(pid, sig, group=False)
        return members
