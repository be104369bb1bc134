"""Where each rank of a job is (`RankPlace`), from the stacks ranks dump when asked (faulthandler, `DUMP_SIGNAL`), a
traceback or a live frame; and which ranks hold up the others (`HangReport`). Data only (no torch)."""

from __future__ import annotations

import csv
import functools
import importlib.util
import itertools
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ddpw_runtime.launch.recorded import Collective, Recorded

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
_ONE_THREAD = "Stack (most recent call first):"  # faulthandler's dump of the signalled thread only (all_threads=False)
_DUMP_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)$')
_TRACEBACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)$')
_FRAMES_SHOWN = 3
_COLLECTIVES = ("/torch/distributed/", "/torch/nn/parallel/distributed.py")  # waiting for the other ranks (and DDP's)
_BACKWARD = ("/torch/autograd/graph.py", "_engine_run_backward")
"""Autograd's C++ engine running `backward()` (file, function), where DDP all-reduces the gradients from hooks that
leave no Python frame: a rank held there while a collective times out waits in that all-reduce."""
_WRAPPER = "/torch/distributed/c10d_logger.py"  # torch's `wrapper` frame around the collective the task called
_HERE = Path(__file__).resolve().parents[2]
_NOT_THE_USERS = (*(str(_HERE / part) for part in ("ddpw_runtime", "ddpw_conf", "hydra_plugins/hydra_ddpw_launcher")),
                  *(sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")),
                  "/site-packages/", "/dist-packages/", "<frozen ")
"""Not the user's code: hydra-ddpw (its plugin too: a multirun's ranks fork inside its `setup`), stdlib, packages;
nor a file an installer put elsewhere (`_installed`), nor torch's, wherever it is (`_torch_folder`)."""
_WORKER = ("/torch/utils/data/_utils/worker.py", "_worker_loop")  # a DataLoader worker's loop (file, function)
_FETCH = "/torch/utils/data/_utils/fetch.py"  # a DataLoader worker making a batch (the dataset, the collate_fn)


@dataclass(frozen=True)
class Frame:
    """One frame of a stack."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"

    @property
    def in_collective(self) -> bool:
        """Whether this frame is torch.distributed's (collectives, barrier, rendezvous), DDP's, or `_BACKWARD`'s."""
        return any(part in self.file for part in _COLLECTIVES) or self.in_backward

    @property
    def in_backward(self) -> bool:
        """Whether this frame is autograd's engine running `backward()` (see `_BACKWARD`)."""
        return self.file.endswith(_BACKWARD[0]) and self.function == _BACKWARD[1]

    @property
    def is_users(self) -> bool:
        """Whether this is the user's code (not hydra-ddpw's, Python's, torch's or an installed package's)."""
        return not any(part in self.file for part in _NOT_THE_USERS) and not _library_file(self.file)


def _library_file(file: str) -> bool:
    """Whether `file` is torch's (`_torch_folder`) or an installed package's outside site-packages (`_installed`)."""
    torch = _torch_folder()
    return (torch is not None and file.startswith(torch)) or _installed(file)


@functools.cache
def _torch_folder() -> str | None:
    """The folder torch's modules are in (with its separator), wherever torch is installed (None: none found)."""
    module = sys.modules.get("torch")
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.join(locations[0], "") if locations else None


@functools.lru_cache(maxsize=1024)
def _installed(file: str) -> bool:
    """Whether an installer put `file` where it is: a folder above it holds a `*.dist-info` whose `RECORD` (or an
    `*.egg-info` whose `installed-files.txt`) lists the top-level package or module `file` is in (`pip install
    --target DIR` with `PYTHONPATH=DIR`, a vendored install, another layout than site-packages). The files of a
    project installed editable (`pip install -e .`, your own repo) stay the user's: its record lists only the hook
    that finds them, and `setup.py develop`'s `*.egg-info` next to them lists no installed files."""
    path = os.path.normpath(file)
    if not os.path.isabs(path):
        return False
    folder, top = os.path.split(path)
    while top not in _installed_tops(folder):
        parent, name = os.path.split(folder)
        if parent == folder:
            return False
        folder, top = parent, name
    return True


@functools.lru_cache(maxsize=256)
def _installed_tops(folder: str) -> frozenset[str]:
    """The top-level packages and modules (names in `folder`) that the distributions recorded in `folder` installed."""
    try:
        names = [name for name in os.listdir(folder) if name.endswith((".dist-info", ".egg-info"))]
    except OSError:
        return frozenset()
    tops: set[str] = set()
    for name in names:
        record = os.path.join(folder, name, "RECORD" if name.endswith(".dist-info") else "installed-files.txt")
        try:
            with open(record, newline="", encoding="utf-8", errors="replace") as rows:
                listed = ([row[0] for row in csv.reader(rows) if row] if name.endswith(".dist-info")
                          else [os.path.join(name, line) for line in rows.read().splitlines()])
        except OSError:
            continue
        tops.update(os.path.normpath(entry).split(os.sep)[0] for entry in listed)
    return frozenset(tops - {"..", ".", ""} - set(names))


@dataclass(frozen=True)
class WorkerPlace:
    """Where one of a rank's DataLoader workers was, making a batch: its main thread's frames, innermost first."""

    pid: int
    frames: tuple[Frame, ...]

    @staticmethod
    def of(pid: int, frames: tuple[Frame, ...]) -> WorkerPlace | None:
        """The place of the process `pid` whose main thread's frames are `frames`, if it is a DataLoader worker making
        a batch (in its dataset or collate_fn), not one waiting for the next (that holds nothing up): its frames up to
        its loop (those below are the rank's, as it forked the worker)."""
        loop = next((i for i, frame in enumerate(frames)
                     if frame.file.endswith(_WORKER[0]) and frame.function == _WORKER[1]), None)
        if loop is None or not any(frame.file.endswith(_FETCH) for frame in frames[:loop]):
            return None
        return WorkerPlace(pid, frames[:loop + 1])


@dataclass(frozen=True)
class RankPlace:
    """Where one rank was: its main thread's frames, innermost first; and its DataLoader's workers that were making
    a batch, where their stacks were taken (a rank forked from hydra-ddpw's rank process, not rank 0 of a plain run)."""

    rank: int
    frames: tuple[Frame, ...] = ()
    silent: str = ""  # why a running rank gave no stack (stopped, stuck in the kernel: it holds the others up)
    workers: tuple[WorkerPlace, ...] = ()

    @property
    def waiting(self) -> bool:
        """Whether the rank was inside torch.distributed, waiting for the other ranks."""
        return any(frame.in_collective for frame in self.frames)

    @property
    def call(self) -> str | None:
        """The torch.distributed function the task called and waits in (`all_reduce`, `barrier`)."""
        inside = [frame for frame in self.frames if frame.in_collective and not frame.file.endswith(_WRAPPER)]
        if not inside:
            return None
        return "backward (DDP's gradient all-reduce)" if inside[-1].in_backward else inside[-1].function

    def where(self) -> str:
        """Where the rank was: its user's frames (`load_batch (train.py:57) <- train (train.py:80)`), then, when it was
        inside a library, the library's call the user's code made and the innermost frame (`, inside __next__
        (.../dataloader.py:733) ... select (.../selectors.py:415)`: its DataLoader, waiting for a worker); or, when the
        stacks of its DataLoader's workers that were making a batch were taken, where those were instead (`; rank 1's
        DataLoader worker (pid 4242) at __getitem__ (train.py:22)`: the line stays short enough for a summary)."""
        if self.silent:
            return f"an unknown place (it gave no stack: {self.silent})"
        text = _where(self.frames, inside=not (self.waiting or self.workers))
        alike: dict[str, list[int]] = {}  # the workers' pids, by where they were
        for worker in self.workers:
            alike.setdefault(_where(worker.frames), []).append(worker.pid)
        return text + "".join(f"; rank {self.rank}'s DataLoader worker{'s' if len(pids) > 1 else ''} "
                              f"(pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}) at {where}"
                              for where, pids in alike.items())


def _where(frames: tuple[Frame, ...], inside: bool = True) -> str:
    """`RankPlace.where` of a stack's `frames`, innermost first; `inside`: with the library's call it was in."""
    users = [frame for frame in frames if frame.is_users][:_FRAMES_SHOWN]
    if not users:
        return " <- ".join(map(str, frames[:_FRAMES_SHOWN])) or "no Python frame"
    text = " <- ".join(map(str, users))
    if not frames[0].is_users and inside:
        called = frames[frames.index(users[0]) - 1]
        text += f", inside {called}" + (f" ... {frames[0]}" if called is not frames[0] else "")
    return text


@dataclass(frozen=True)
class HangReport:
    """Where every rank was at one moment (`why`: a collective timed out, the time limit, a request, a stall), and
    which ranks held the others up: when some ranks waited in a collective, those that were not in it."""

    why: str
    places: tuple[RankPlace, ...]
    stacks: str = ""  # where every thread's full stack is (the ranks' `stacks_rank_<k>.txt`)
    ended: tuple[int, ...] = ()  # ranks that had ended (nothing to look at)
    recorded: tuple[Recorded, ...] = ()  # what the ranks' flight recorders held, where they were dumped
    recorder: str = ""  # where the ranks' flight-recorder dumps are (`fr_rank_<k>`)

    @property
    def waiting(self) -> list[int]:
        """The ranks that waited in a collective."""
        return [place.rank for place in self.places if place.waiting]

    @property
    def culprits(self) -> list[int]:
        """The ranks that were not in the collective the others waited in (none when no rank waited)."""
        return [place.rank for place in self.places if not place.waiting] if self.waiting else []

    def place(self, rank: int) -> RankPlace | None:
        """Where `rank` was, if it was looked at."""
        return next((place for place in self.places if place.rank == rank), None)

    def record(self, rank: int) -> Recorded | None:
        """What `rank`'s flight recorder held, if it was dumped."""
        return next((recorded for recorded in self.recorded if recorded.rank == rank), None)

    @property
    def awaited(self) -> Collective | None:
        """The collective the waiting ranks were held up in, in the first one's last group (flight recorders): the first
        a culprit did not enter (NCCL enqueues the next early), else the furthest one entered (None: none dumped)."""
        newest = [record.newest for rank in self.waiting if (record := self.record(rank)) and record.newest]
        if not newest:
            return None
        group = newest[0].group
        furthest = max((c for c in newest if c.group == group), key=lambda collective: collective.seq)
        reached = [last.seq if (last := record.in_group(group)) else 0
                   for rank in self.culprits if (record := self.record(rank))]
        if not reached:
            return furthest
        first = min(reached) + 1
        return next((collective for rank in self.waiting if (record := self.record(rank))
                     for collective in record.entered if collective.group == group and collective.seq == first),
                    furthest)

    def lines(self) -> list[str]:
        """One line per rank, those that held the others up first (`rank 2: NOT IN THE COLLECTIVE, at ...`), with what
        its dumped flight recorder last entered (`; collectives: last entered barrier #4, not all_reduce #5`)."""
        culprits = self.culprits
        lines = []
        for place in sorted(self.places, key=lambda place: (place.rank not in culprits, place.rank)):
            state = ("NOT ANSWERING, " if place.silent else "NOT IN THE COLLECTIVE, " if place.rank in culprits
                     else f"waiting in {place.call}, " if place.waiting else "")
            lines.append(f"rank {place.rank}: {state}at {place.where()}{self._collectives(place.rank)}")
        return lines + [f"rank {rank}: had ended" for rank in self.ended]

    def _collectives(self, rank: int) -> str:
        """What `rank`'s flight recorder says, as its line ends ('' when it was not dumped)."""
        record = self.record(rank)
        if record is None:
            return ""
        awaited = self.awaited
        last = record.newest if awaited is None else record.in_group(awaited.group)
        shown = last or record.newest  # (none in the awaited collective's group: the last it entered elsewhere)
        text = f"; collectives: last entered {shown}" if shown is not None else "; collectives: none entered"
        if awaited is not None and (last is None or last.seq < awaited.seq):
            text += f", not {awaited}"
        return text

    def text(self) -> str:
        """The report as the console shows it: what it is about, then one indented line per rank."""
        head = f"where each rank was ({self.why})" + (f"; every thread's stack: {self.stacks}" if self.stacks else "")
        if self.recorded and self.recorder:
            head += f"; each rank's last collectives: {self.recorder}"
        return "\n".join([head + ":", *(f"  {line}" for line in self.lines())])


def from_dump(rank: int, text: str) -> RankPlace | None:
    """Where `rank` was, from the main thread (the one signalled) of the last faulthandler dump in `text`, if any; or
    from the one thread of a dump that has no other (`_ONE_THREAD`: a fork of rank 0 of a plain run, a DataLoader
    worker, dumps so), when that comes last."""
    lines = text.splitlines()
    dump = last_dump(lines)
    alone = [i for i, line in enumerate(lines) if line == _ONE_THREAD]
    if alone and (not dump or alone[-1] > dump[-1]):
        return _thread_place(rank, lines, alone[-1])
    if not dump:
        return None
    return _thread_place(rank, lines, next((i for i in dump if lines[i].startswith("Current thread")), dump[0]))


def in_a_dataloader(place: RankPlace) -> bool:
    """Whether `place` is in torch's data loading (a DataLoader's `__next__`, waiting for its workers if it has any)."""
    return any("/torch/utils/data/" in frame.file for frame in place.frames)


def last_dump(lines: list[str]) -> list[int]:
    """Where each thread's stack starts in the last faulthandler dump in `lines` ([] when there is none)."""
    starts = [i for i, line in enumerate(lines) if _THREAD.match(line)]
    dump = starts[-1:]
    for start in reversed(starts[:-1]):
        if not _only_frames(lines[start + 1:dump[0]]):
            break
        dump.insert(0, start)
    return dump


def ends_in_a_dump(lines: list[str]) -> int | None:
    """Where the faulthandler dump that ends `lines` starts (a rank ended by a signal it dumps on), else None."""
    dump = last_dump(lines)
    return dump[0] if dump and _only_frames(lines[dump[-1] + 1:]) else None


def _only_frames(lines: list[str]) -> bool:
    """Whether `lines` are only a dump's frames and blank lines."""
    return all(not line.strip() or _DUMP_FRAME.match(line) for line in lines)


def from_crash_report(rank: int, lines: list[str]) -> RankPlace | None:
    """Where `rank` was when it crashed, from faulthandler's report `lines`: its main thread, listed last, if any."""
    starts = [i for i, line in enumerate(lines) if _THREAD.match(line)]
    return _thread_place(rank, lines, starts[-1]) if starts else None


def _thread_place(rank: int, lines: list[str], start: int) -> RankPlace:
    return RankPlace(rank, _frames(itertools.takewhile(bool, map(_DUMP_FRAME.match, lines[start + 1:]))))


def from_traceback(rank: int, text: str) -> RankPlace:
    """Where `rank` was when it raised, from its traceback `text` (innermost frame first)."""
    return RankPlace(rank, _frames(map(_TRACEBACK_FRAME.match, text.splitlines()))[::-1])


def _frames(matches: Iterable[re.Match[str] | None]) -> tuple[Frame, ...]:
    return tuple(Frame(m["file"], int(m["line"]), m["func"]) for m in matches if m)


def from_frame(rank: int, frame: FrameType | None) -> RankPlace:
    """Where `rank` is, given its main thread's innermost live frame."""
    walked = traceback.walk_stack(frame) if frame is not None else ()  # walk_stack(None) walks the caller's
    return RankPlace(rank, tuple(Frame(f.f_code.co_filename, line, f.f_code.co_name) for f, line in walked))


def read_from(path: Path, offset: int) -> str:
    """What `path` holds past `offset` ('' when it is missing)."""
    try:
        with open(path, "rb") as src:
            src.seek(offset)
            return src.read().decode(errors="backslashreplace")
    except OSError:
        return ""


def shown_ranks(places: Iterable[RankPlace]) -> dict[int, str]:
    """`where()` of each place, by rank."""
    return {place.rank: place.where() for place in places}


def rank_ranges(ranks: list[int]) -> str:
    """`[0, 1, 2, 5]` as `0-2, 5`."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)
