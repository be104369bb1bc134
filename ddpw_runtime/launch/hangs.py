"""Where a job's ranks are while they run: their stacks taken (`take_places`), a request answered (`python -m
ddpw_runtime.launch.where RUN_DIR` writes a file in the job's output dir, which every kind of supervisor reads), a stall
noticed (`platform.stall_timeout_min`). docs/results-logs-failures.md, "Hangs and time limits"."""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ddpw_runtime.launch.console import file_size
from ddpw_runtime.launch.payload import read_pickled, write_atomically
from ddpw_runtime.launch.plan import DUMP_SIGNAL, LaunchPlan, recorder_file, stacks_file
from ddpw_runtime.launch.recorded import recorded_in
from ddpw_runtime.launch.signals import send_to_group
from ddpw_runtime.launch.stacks import HangReport, RankPlace, WorkerPlace, from_dump, in_a_dataloader, read_from

CHECK_S = 0.5
"""How often a job's supervisor looks for a request and for a stall while its ranks run."""
_STACK_DUMP_WAIT_S = 0.2  # longest wait for faulthandler to write the ranks' stacks (`DUMP_SIGNAL`)
_STACK_DUMP_QUIET_S = 0.01  # a stacks file that grew and then did not change for this long is written
_STACK_DUMP_POLL_S = 0.002
REQUEST = "where.request"
"""The file in a job's output dir that asks its supervisors where the ranks are (a pickled `WhereRequest`)."""


@dataclass(frozen=True)
class WhereRequest:
    """A request for where a job's ranks are; `token` tells its answers from older ones."""

    token: str


@dataclass(frozen=True)
class WhereAnswer:
    """One node's answer to a `WhereRequest`: where each of its ranks is."""

    token: str
    node: int
    n_nodes: int
    report: HangReport


def answer_file(log_dir: Path, node: int | str) -> Path:
    """Where node `node` of the job whose output dir is `log_dir` answers a request (`*`: every node's, a pattern)."""
    return log_dir / f"where_node_{node}.answer"


def take_places(plan: LaunchPlan, pids: Mapping[int, int],
                left: Callable[[int], bool] = lambda rank: False) -> dict[int, RankPlace]:
    """Where each running rank (`pids`: pid by rank) is now, from the stacks it writes on `DUMP_SIGNAL` (none in time:
    left out), with its DataLoader's workers (`_with_workers`); a rank whose flight-recorder dump exists dumps it
    again. A rank that has `left` its job (it writes no stack any more) is not waited for."""
    files = {rank: stacks_file(plan.log_dir, rank) for rank in pids}
    before = {rank: file_size(path) for rank, path in files.items()}
    recorders = {rank: _version(recorder_file(plan.log_dir, rank)) for rank in pids}
    armed = {rank: (recorder_file(plan.log_dir, rank), version) for rank, version in recorders.items()
             if version is not None}
    for pid in pids.values():
        send_to_group(pid, DUMP_SIGNAL, group=False)
    _wait_for_dumps(files, before, armed, left)
    places = {rank: from_dump(rank, read_from(path, before[rank])) or _silent_place(rank, pids[rank])
              for rank, path in files.items()}
    return _with_workers({rank: place for rank, place in places.items() if place is not None}, pids, files, left)


def _with_workers(places: dict[int, RankPlace], pids: Mapping[int, int], files: Mapping[int, Path],
                  left: Callable[[int], bool]) -> dict[int, RankPlace]:
    """`places`, each rank in a DataLoader (not in a collective) with where its workers that make a batch are
    (`WorkerPlace`). Its workers are the processes it forked that still have its stack dump on `DUMP_SIGNAL`
    (faulthandler's registration, inherited by fork; `_dumping_children`): they write into the rank's stacks file,
    so each rank's are asked one at a time (the ranks side by side). A process started by spawn or forkserver, or that
    ran another program, or dropped the registration, is never sent the signal (its default action would end it)."""
    children = {rank: _dumping_children(pids[rank]) for rank, place in places.items()
                if not place.silent and not place.waiting and in_a_dataloader(place)}
    workers: dict[int, list[WorkerPlace]] = {rank: [] for rank in children}
    for turn in range(max(map(len, children.values()), default=0)):
        asked = {rank: found[turn] for rank, found in children.items() if turn < len(found)}
        before = {rank: file_size(files[rank]) for rank in asked}
        for pid in asked.values():
            send_to_group(pid, DUMP_SIGNAL, group=False)
        _wait_for_dumps({rank: files[rank] for rank in asked}, before, {}, left)
        for rank, pid in asked.items():
            dumped = from_dump(rank, read_from(files[rank], before[rank]))
            if dumped is not None and (worker := WorkerPlace.of(pid, dumped.frames)) is not None:
                workers[rank].append(worker)
    return {rank: replace(place, workers=tuple(workers[rank])) if workers.get(rank) else place
            for rank, place in places.items()}


def _dumping_children(pid: int) -> list[int]:
    """The processes `pid` started that catch `DUMP_SIGNAL` (Linux's /proc; none elsewhere), never this one."""
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != os.getpid()]
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            if parent != pid:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except (OSError, IndexError, ValueError):  # (it ended meanwhile)
            continue
        caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) >> (DUMP_SIGNAL - 1) & 1:
            found.append(int(entry))
    return sorted(found)


_SILENT = {"T": "stopped, as by SIGSTOP, Ctrl-Z or a debugger", "t": "stopped by a debugger",
           "D": "stuck in the kernel, in a call no signal interrupts (a hung file system, device or driver)"}
"""Why a rank gives no stack, by its process's state (`/proc/PID/stat`): it cannot go on."""


def _silent_place(rank: int, pid: int) -> RankPlace | None:
    """`rank`'s place when it wrote no stack as it cannot go on; None when it ended or may just have been slow."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None
    return RankPlace(rank, silent=_SILENT[state]) if state in _SILENT else None


def report_of(plan: LaunchPlan, why: str, places: Mapping[int, RankPlace]) -> HangReport:
    """The report of this node's ranks at one moment: those in `places`, the others as ended."""
    ended = tuple(rank for rank in plan.global_ranks if rank not in places)
    return HangReport(why, tuple(places[rank] for rank in sorted(places)), str(stacks_file(plan.log_dir, "<k>")),
                      ended, recorded_in(plan.log_dir, places), str(recorder_file(plan.log_dir, "<k>")))


def drop_stacks(plan: LaunchPlan, empty_only: bool = True) -> None:
    """Remove this node's ranks' stacks files and flight-recorder dumps that are empty (no rank was asked), or, not
    `empty_only`, all of them (as a job starts: an earlier attempt's or job's in the same output dir would mislead)."""
    for rank in plan.global_ranks:
        for path in (stacks_file(plan.log_dir, rank), recorder_file(plan.log_dir, rank)):
            if path.exists() and (not empty_only or file_size(path) == 0):
                path.unlink(missing_ok=True)


def _version(path: Path) -> tuple[int, int, int] | None:
    """What tells one write of `path` from the next (a dump replaces the file); None when missing."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def _wait_for_dumps(files: Mapping[int, Path], before: Mapping[int, int],
                    recorders: Mapping[int, tuple[Path, tuple[int, int, int]]], left: Callable[[int], bool]) -> None:
    """Wait (at most `_STACK_DUMP_WAIT_S`) until every file in `files` grew past its size `before` (or its rank `left`),
    then was quiet for `_STACK_DUMP_QUIET_S`, and every rank's dump in `recorders` (not one that `left`) differs from
    its version there."""
    start = time.monotonic()
    last, changed_at = dict(before), start
    while time.monotonic() - start < _STACK_DUMP_WAIT_S:
        time.sleep(_STACK_DUMP_POLL_S)
        sizes = {rank: file_size(path) for rank, path in files.items()}
        now = time.monotonic()
        if sizes != last:
            last, changed_at = sizes, now
        elif (now - changed_at >= _STACK_DUMP_QUIET_S
              and all(sizes[rank] > before[rank] or left(rank) for rank in files)
              and all(_version(path) != version or left(rank) for rank, (path, version) in recorders.items())):
            return


class Watch:
    """What a job's supervisor looks at while `plan`'s ranks run (`check`, every `CHECK_S`): a request for where they
    are, and with `platform.stall_timeout_min` a stall (no log line, no stack moved between two looks half the time
    apart), reported once. `take`: where each running rank is now; `prefix`: before its console lines."""

    def __init__(self, plan: LaunchPlan, take: Callable[[], dict[int, RankPlace]], prefix: str = "") -> None:
        self.plan = plan
        self.take = take
        self.prefix = prefix
        self.due = time.monotonic() + CHECK_S  # when the next check is
        minutes = plan.platform.stall_timeout_min
        self.stall_s = None if minutes is None else minutes * 60.0
        self.stalled: HangReport | None = None  # the last stall's report (cleared when the job moves again)
        self.stopped_job = False  # whether a stall stopped the job (`platform.stop_on_stall`)
        earlier = read_pickled(plan.log_dir / REQUEST, WhereRequest)  # an earlier run's (in this dir) is not for it
        self._answered = earlier.token if earlier is not None else None
        self._sizes = self._log_sizes()
        self._quiet_since = time.monotonic()
        self._look: dict[int, RankPlace] | None = None

    def check(self) -> bool:
        """Answer a request, look for a stall (when due); whether the job stalled and is to be stopped."""
        now = time.monotonic()
        if now < self.due:
            return False
        self.due = now + CHECK_S
        self._answer()
        self.stopped_job = self._stall(now) and self.plan.platform.stop_on_stall
        return self.stopped_job

    def _answer(self) -> None:
        request = read_pickled(self.plan.log_dir / REQUEST, WhereRequest)
        if request is None or request.token == self._answered:
            return
        self._answered = request.token
        report = report_of(self.plan, "asked", self.take())
        self._say(report)
        answer = WhereAnswer(request.token, self.plan.node_rank, self.plan.platform.n_nodes, report)
        write_atomically(answer_file(self.plan.log_dir, self.plan.node_rank), pickle.dumps(answer), 0o644)

    def _stall(self, now: float) -> bool:
        """Whether the job stalled just now (its report then said so)."""
        if self.stall_s is None:
            return False
        sizes = self._log_sizes()
        if sizes != self._sizes:  # a line written: the job moves
            self._sizes, self._quiet_since, self._look, self.stalled = sizes, now, None, None
            return False
        quiet = now - self._quiet_since
        if self.stalled is not None or quiet < self.stall_s / 2:
            return False
        if self._look is None:  # the first look, half the time in
            self._look = self.take()
            return False
        if quiet < self.stall_s:
            return False
        places = self.take()
        if places != self._look:  # it moved: look again half the time later
            self._look, self._quiet_since = places, now - self.stall_s / 2
            return False
        minutes = self.plan.platform.stall_timeout_min
        self.stalled = report_of(self.plan, f"no rank wrote a line or moved for {quiet:.0f} s, "
                                            f"platform.stall_timeout_min={minutes:g}", places)
        self._say(self.stalled)
        return True

    def _say(self, report: HangReport) -> None:
        sys.stderr.write("".join(f"[ddpw] {self.prefix}{line}\n" for line in report.text().splitlines()))
        sys.stderr.flush()

    def _log_sizes(self) -> list[int]:
        return [file_size(self.plan.log_file(rank)) for rank in self.plan.global_ranks]
