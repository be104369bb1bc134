"""Runs one benchmark command in a fresh folder and collects what its ranks wrote.

Every command runs as a subprocess of the driver, in its own temporary working directory (so Hydra's
outputs of one run never meet another's), with `BENCH_MARKS` pointing at a folder where each rank
leaves its timestamps (see apps/rank_work.py). Times are wall-clock `time.time()` values, comparable
across the processes of this machine: the command's start is taken just before the process is created.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

APPS = Path(__file__).resolve().parent.parent / "apps"
COMMAND_TIMEOUT_S = 600.0
_POLL_S = 0.02
_OUTPUT_TAIL = 4000
QUIET_IDLE = 0.85
"""A run starts only once the CPUs were at least this idle over QUIET_WINDOW_S (other work on the
machine would skew the timings), or after QUIET_MAX_WAIT_S of waiting."""
QUIET_WINDOW_S = 0.3
QUIET_MAX_WAIT_S = 60.0


class CommandFailed(RuntimeError):
    """A command that should have succeeded exited non-zero (or the other way round)."""


@dataclass
class Run:
    """One run of one command."""

    start: float
    """time.time() just before the process was created."""
    end: float
    """time.time() just after the process was seen to exit."""
    returncode: int
    marks: list[dict] = field(default_factory=list)
    """What each rank wrote (one dict per rank and job)."""
    peak_rss_mb: float | None = None
    """VmHWM of the command's own process (the controller), last read while it ran."""
    imported_torch: bool | None = None
    """Whether libtorch was mapped in the command's own process while its ranks ran."""
    output_tail: str = ""
    idle_before: float = 1.0
    """Fraction of CPU time idle just before the run started (see `wait_for_quiet`)."""
    cpu_s: float = 0.0
    """CPU time (user + system) of the command and every process it waited for (its ranks and helpers)."""
    page_faults: int = 0
    """Minor page faults of the same processes: a count that does not drift with the machine's speed."""

    @property
    def wall_s(self) -> float:
        """The whole command's wall time."""
        return self.end - self.start

    def since_start(self, key: str, tag: str | None = None) -> float:
        """Seconds from the command's start until the LAST rank (of job `tag`, if given) reached `key`."""
        values = [m[key] for m in self.marks if key in m and (tag is None or m["tag"] == tag)]
        if not values:
            raise CommandFailed(f"no rank recorded {key!r}" + (f" for {tag}" if tag else ""))
        return max(values) - self.start


def python_argv(script: str, *args: str) -> list[str]:
    """`python apps/<script> args...` with this interpreter."""
    return [sys.executable, str(APPS / script), *args]


def run_command(
    argv: Sequence[str],
    expect_ok: bool = True,
    watch_controller: bool = False,
    ranks_expected: int = 0,
    quiet_first: bool = True,
) -> Run:
    """Run `argv` once in a fresh folder; its Run. Raises CommandFailed when the exit status is not
    what `expect_ok` says.

    `watch_controller`: poll the command's own process for its peak RSS, and look once, when
    `ranks_expected` ranks have written their marks (they are running then), whether it mapped libtorch.
    `quiet_first`: wait for a quiet machine first (see `wait_for_quiet`); off for the commands of a
    sweep that follow the first, since they belong to one measured sweep.
    """
    workdir = Path(tempfile.mkdtemp(prefix="ddpw-bench-"))
    marks_dir = workdir / "marks"
    marks_dir.mkdir()
    env = _environment(marks_dir)
    idle = wait_for_quiet() if quiet_first else 1.0
    try:
        with open(workdir / "output.txt", "wb") as output:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.time()
            proc = subprocess.Popen(list(argv), cwd=workdir, env=env, stdout=output, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            if watch_controller:
                peak, torch_seen = _watch(proc, marks_dir, ranks_expected)
            else:
                peak, torch_seen = None, None
                _wait(proc)
            end = time.time()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        run = Run(start=start, end=end, returncode=proc.returncode, marks=_read_marks(marks_dir), cpu_s=cpu_s,
                  page_faults=after.ru_minflt - before.ru_minflt,
                  peak_rss_mb=peak, imported_torch=torch_seen, idle_before=idle,
                  output_tail=(workdir / "output.txt").read_text(errors="replace")[-_OUTPUT_TAIL:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if (run.returncode == 0) != expect_ok:
        raise CommandFailed(f"{' '.join(argv)} exited {run.returncode}:\n{run.output_tail}")
    return run


def wait_for_quiet() -> float:
    """Wait until the machine is quiet (see QUIET_IDLE); the idle fraction last seen."""
    deadline = time.monotonic() + QUIET_MAX_WAIT_S
    while True:
        idle = idle_fraction(QUIET_WINDOW_S)
        if idle >= QUIET_IDLE or time.monotonic() > deadline:
            quiet_log.append(idle)
            return idle
        time.sleep(1.0)


quiet_log: list[float] = []
"""The idle fraction before every run of this process, for the report."""


def idle_fraction(window_s: float) -> float:
    """Fraction of all CPUs' time spent idle over the next `window_s` seconds (Linux /proc/stat)."""
    def sample() -> list[int]:
        with open("/proc/stat") as stat:
            return [int(x) for x in stat.readline().split()[1:]]

    try:
        first = sample()
        time.sleep(window_s)
        second = sample()
    except OSError:
        time.sleep(window_s)
        return 1.0
    delta = [b - a for a, b in zip(first, second, strict=True)]
    total = sum(delta)
    return (delta[3] + delta[4]) / total if total else 1.0  # idle + iowait


def _environment(marks_dir: Path) -> dict[str, str]:
    """The driver's environment, minus anything that would make a command think it is a rank already or
    keep Python from caching bytecode (every tool then runs compiled code after the warm-up run, as where
    it is installed: pip compiles what it installs, an editable install compiles on first use), plus the
    marks folder and the apps folder on the import path (submitit's task processes need it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONDONTWRITEBYTECODE")
           and not k.startswith(("TORCHELASTIC_", "SUBMITIT_"))}
    env["BENCH_MARKS"] = str(marks_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(APPS), env.get("PYTHONPATH", "")) if p)
    return env


def _wait(proc: subprocess.Popen) -> None:
    # A blocking wait sees the exit at once; `wait(timeout=...)` polls, every 50 ms at the end, which would
    # round every wall time up to that step. A timer kills a command that runs too long.
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(COMMAND_TIMEOUT_S, kill)
    timer.start()
    try:
        proc.wait()
    finally:
        timer.cancel()
    if expired.is_set():
        raise CommandFailed(f"{proc.args!r} ran past {COMMAND_TIMEOUT_S:.0f} s")


def _watch(proc: subprocess.Popen, marks_dir: Path, ranks_expected: int) -> tuple:
    """Poll `proc` until it exits: (peak RSS in MB, whether libtorch was mapped while ranks ran)."""
    status = Path(f"/proc/{proc.pid}/status")
    maps = Path(f"/proc/{proc.pid}/maps")
    peak_kb: int | None = None
    torch_seen: bool | None = None
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while proc.poll() is None:
        try:
            peak_kb = _vm_hwm_kb(status.read_text()) or peak_kb
            if torch_seen is None and len(list(marks_dir.glob("*.json"))) >= ranks_expected:
                torch_seen = "libtorch" in maps.read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(_POLL_S)
    return (peak_kb / 1024 if peak_kb else None), torch_seen


def _vm_hwm_kb(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def _read_marks(marks_dir: Path) -> list[dict]:
    marks = []
    for path in sorted(marks_dir.glob("*.json")):
        data = json.loads(path.read_text())
        data["tag"] = path.stem.rsplit("_rank", 1)[0]
        marks.append(data)
    return marks


@dataclass(frozen=True)
class Stats:
    """Median, min and max of a handful of measurements."""

    median: float
    min: float
    max: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Stats:
        """The Stats of `values` (at least one)."""
        return Stats(statistics.median(values), min(values), max(values), len(values))

    def to_dict(self) -> dict[str, float]:
        """As plain numbers (for raw.json)."""
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}

    @staticmethod
    def from_dict(data: dict[str, float]) -> Stats:
        """Back from `to_dict`."""
        return Stats(data["median"], data["min"], data["max"], int(data["n"]))

    def fmt(self, scale: float = 1.0, digits: int = 2) -> str:
        """`median (min–max)` with `digits` decimals, values multiplied by `scale`."""
        return f"{self.median * scale:.{digits}f} ({self.min * scale:.{digits}f}–{self.max * scale:.{digits}f})"
