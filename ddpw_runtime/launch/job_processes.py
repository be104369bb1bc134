"""Every process of one job on this node, however it was started, and how to stop them all.

A rank leads its own process group, so signalling the group reaches what it started in the usual way;
a process started in a new session (`start_new_session=True`, `setsid`, a daemon) leaves that group,
and once its parent has died, its parent is init. Two ways still reach it:

- a cgroup per job (cgroup v2, where this user may create one below its own cgroup): every rank joins
  it as the starter forks it, everything it starts stays in it, and `cgroup.kill` stops them all;
- otherwise, and for the processes a rank that runs in the caller's own process starts, the `DDPW_JOB`
  variable, which every rank has and its descendants inherit (unless one clears its environment): the
  job's processes are the ones whose environment names the job.

Stopping gives SIGTERM first and a moment, so helpers that clean up after their parent (the
`multiprocessing` resource tracker, which removes the semaphores and shared memory a killed rank left in
/dev/shm) can do so, then SIGKILL; every wait is bounded and what would not die is reported by pid.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

from ddpw_runtime.launch.payload import JOB_ENV
from ddpw_runtime.launch.signals import send_to_group

_TERM_WAIT_S = 1.0
_KILL_WAIT_S = 5.0
_POLL_S = 0.01
_numbers = itertools.count()


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, when the unified hierarchy is mounted."""
    try:
        line = next(line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for mount in mounts:
        fields = mount.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4]) / line[3:].lstrip("/")
    return None


class JobProcesses:
    """The processes of one job (`key`) on this node (see the module docstring), made in the rank starter.
    `spared`: pids never counted as the job's (the launching process, whose environment names the job
    while its own rank runs)."""

    def __init__(self, key: str, spared: frozenset[int] = frozenset()) -> None:
        self.key = key
        self.cgroup = self._make_cgroup()
        self.spared = spared | {os.getpid()}

    def _make_cgroup(self) -> Path | None:
        parent = _own_cgroup()
        if parent is None:
            return None
        path = parent / f"ddpw-{os.getpid()}-{next(_numbers)}"
        try:
            path.mkdir()
        except OSError:
            return None
        return path

    def adopt(self, pid: int) -> None:
        """Put process `pid` (0: the calling one) into the job's cgroup, so what it starts from now on is
        the job's; without a cgroup, its environment names the job (`JOB_ENV`) for what it starts."""
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass

    def release(self, pid: int) -> None:
        """Let an adopted process `pid` go (back into the cgroup the job's cgroup was made in) and never
        count it as the job's, so stopping the job does not stop it."""
        self.spared = self.spared | {pid}
        if self.cgroup is not None:
            try:
                (self.cgroup.parent / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass

    def members(self) -> set[int]:
        """The job's live processes: its cgroup's, or those whose environment names the job."""
        if self.cgroup is not None:
            try:
                return {int(pid) for pid in (self.cgroup / "cgroup.procs").read_text().split()} - self.spared
            except OSError:
                return set()
        marker = f"{JOB_ENV}={self.key}".encode()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.spared:
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:  # gone, a zombie, or another user's
                continue
        return found

    def stop(self) -> list[int]:
        """Stop every process of the job (SIGTERM, a moment, SIGKILL); the pids that are still there."""
        for sig, wait_s in ((signal.SIGTERM, _TERM_WAIT_S), (signal.SIGKILL, _KILL_WAIT_S)):
            left = self._signal(sig)
            end = time.monotonic() + wait_s
            while left and time.monotonic() < end:
                time.sleep(_POLL_S)
                left = self.members()
            if not left:
                return []
        return sorted(left)

    def _signal(self, sig: int) -> set[int]:
        members = self.members()
        if self.cgroup is not None and sig == signal.SIGKILL and (self.cgroup / "cgroup.kill").exists():
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
                return members
            except OSError:
                pass
        for pid in members:
            send_to_group(pid, sig)
            send_to_group(pid, sig, group=False)
        return members

    def close(self) -> None:
        """Remove the job's cgroup (once it is empty)."""
        if self.cgroup is not None:
            try:
                self.cgroup.rmdir()
            except OSError:
                pass
