"""Starts the ranks of one node, waits for them, stops them all on the first failure, and names the
root cause."""

from __future__ import annotations

import os
import pickle
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ddpw_runtime.payload import RankPayload
from ddpw_runtime.plan import LaunchPlan
from ddpw_runtime.results import JobTimedOut, RankFailure, RankResult, Terminated
from ddpw_runtime.stacks import where
from ddpw_runtime.starter import RankStarter

_LOG_TAIL_LINES = 40


_STACK_DUMP_WAIT_S = 0.1
"""Longest wait for faulthandler to write a rank's stacks (SIGUSR1) before the rank is stopped."""
_STACK_DUMP_QUIET_S = 0.01
"""A rank's stacks count as written once its log grew and then did not change for this long."""
_STACK_DUMP_POLL_S = 0.002


@dataclass
class _Exits:
    codes: Dict[int, int] = field(default_factory=dict)
    seen_at: Dict[int, float] = field(default_factory=dict)
    stopped: Dict[int, bool] = field(default_factory=dict)
    """Ranks that were still running when the job was stopped."""
    signals_sent: Set[int] = field(default_factory=set)
    """Signals sent to the ranks."""


class _Ranks:
    """The running ranks of one node: their pids, exits, and how to stop them."""

    def __init__(self, starter: RankStarter, log_files: Dict[int, Path]) -> None:
        self.starter = starter
        self.log_files = log_files
        self.pids: Dict[int, int] = {}
        self.exits = _Exits()

    def running(self) -> List[int]:
        return [pid for pid, rank in self.pids.items() if rank not in self.exits.codes]

    def send(self, sig: int, group: bool = True) -> None:
        """Send `sig` to every running rank (and, with `group`, to what it started)."""
        self.exits.signals_sent.add(sig)
        for pid in self.running():
            try:
                os.killpg(pid, sig) if group else os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def record(self, event: Tuple[int, int]) -> int:
        pid, code = event
        rank = self.pids[pid]
        self.exits.codes[rank] = code
        self.exits.seen_at[rank] = time.time()
        return rank

    def begin_stop(self, sig: int = signal.SIGTERM) -> None:
        """Dump the stacks of the running ranks into their logs, then send them `sig`."""
        running = [self.pids[pid] for pid in self.running()]
        for rank in running:
            self.exits.stopped[rank] = True
        if running:
            logs = [self.log_files[rank] for rank in running]
            before = [_size(log) for log in logs]
            self.send(signal.SIGUSR1, group=False)
            _wait_for_dumps(logs, before)
        self.send(sig)

    def wait(self, stop_grace_s: float, time_limit_s: float) -> bool:
        """Wait for every rank; on the first failure stop the others (SIGTERM, SIGKILL after
        `stop_grace_s`). Returns whether the job hit `time_limit_s` and was stopped for it."""
        grace_end = float("inf")
        limit_end = time.monotonic() + time_limit_s
        timed_out = False
        while self.running():
            timeout = min(grace_end, limit_end) - time.monotonic()
            event = self.starter.next_exit(None if timeout == float("inf") else max(0.0, timeout))
            if event is None:
                if time.monotonic() >= grace_end:
                    self.send(signal.SIGKILL)
                    grace_end = float("inf")
                elif time.monotonic() >= limit_end:
                    timed_out, limit_end = True, float("inf")
                    self.begin_stop()
                    grace_end = time.monotonic() + stop_grace_s
                continue
            rank = self.record(event)
            if self.exits.codes[rank] != 0 and not self.exits.stopped:
                self.begin_stop()
                grace_end = time.monotonic() + stop_grace_s
        return timed_out

    def interrupt(self, sig: int, grace_s: float) -> None:
        """Pass `sig` (SIGINT or SIGTERM) on to every rank, give them `grace_s` to finish, then kill
        them; a second Ctrl-C kills them at once."""
        for pid in self.running():
            self.exits.stopped[self.pids[pid]] = True
        self.send(sig)
        end = time.monotonic() + grace_s
        try:
            while self.running():
                event = self.starter.next_exit(max(0.0, end - time.monotonic()))
                if event is None:
                    break
                self.record(event)
        except KeyboardInterrupt:
            pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL every running rank and wait until each has exited."""
        self.send(signal.SIGKILL)
        while self.running():
            event = self.starter.next_exit(None)
            if event is not None:
                self.record(event)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _wait_for_dumps(logs: List[Path], before: List[int]) -> None:
    """Wait until every log in `logs` grew past its size `before` and has then been quiet for
    `_STACK_DUMP_QUIET_S` (faulthandler has written the stacks), at most `_STACK_DUMP_WAIT_S`."""
    start = time.monotonic()
    last, changed_at = before, start
    while time.monotonic() - start < _STACK_DUMP_WAIT_S:
        time.sleep(_STACK_DUMP_POLL_S)
        sizes = [_size(log) for log in logs]
        now = time.monotonic()
        if sizes != last:
            last, changed_at = sizes, now
        elif all(size > old for size, old in zip(sizes, before)) and now - changed_at >= _STACK_DUMP_QUIET_S:
            return


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While supervising, SIGTERM raises `Terminated` (in the main thread only) so the ranks are
    stopped with a grace period instead of the controller vanishing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_node(
    starter: RankStarter,
    payload: RankPayload,
    payload_path: Path,
    stop_grace_s: float,
    local_ranks: Optional[Sequence[int]] = None,
    on_start: Optional[Callable[[int], None]] = None,
    listen_fd: Optional[int] = None,
    interrupt_grace_s: float = 10.0,
) -> List[RankResult]:
    """Run the ranks of `payload.plan` on this node; their results in rank order, or RankFailure
    (JobTimedOut past `platform.timeout_min`).

    `local_ranks` limits which of the node's ranks are started (the others run elsewhere, such as in
    the caller); `on_start(pid)` is called as each one starts. `listen_fd`, the bound rendezvous
    socket, goes to global rank 0 (which hosts the store). Ctrl-C or SIGTERM to this process is passed
    on to the ranks, which get `interrupt_grace_s` to finish before they are killed; then the
    KeyboardInterrupt (or `Terminated`) propagates.
    """
    plan = payload.plan
    first = plan.global_ranks[0]
    ranks = plan.global_ranks if local_ranks is None else [first + local_rank for local_rank in local_ranks]
    job = _Ranks(starter, {rank: plan.log_file(rank) for rank in ranks})
    with _sigterm_raises():
        try:
            for rank in ranks:
                pid = starter.start(str(payload_path), rank - first, listen_fd if rank == 0 else None)
                job.pids[pid] = rank
                if on_start is not None:
                    on_start(pid)
            timed_out = job.wait(stop_grace_s, plan.platform.timeout_min * 60.0)
        except KeyboardInterrupt:
            job.interrupt(signal.SIGINT, interrupt_grace_s)
            raise
        except Terminated:
            job.interrupt(signal.SIGTERM, interrupt_grace_s)
            raise
        except BaseException:
            job.begin_stop()
            job.kill()
            raise
    exits = job.exits
    if timed_out:
        raise JobTimedOut(plan.platform.timeout_min, {rank: where(plan.log_file(rank)) for rank in ranks})
    results = {rank: _read_result(payload, rank) for rank in ranks}
    failed = [r for r in ranks if exits.codes.get(r) != 0 or not (results[r] and results[r].ok)]
    if failed:
        raise _root_cause(plan, results, exits, failed)
    return [results[r] for r in ranks]  # type: ignore[misc]


def _read_result(payload: RankPayload, rank: int) -> Optional[RankResult]:
    try:
        with open(payload.result_file(rank), "rb") as src:
            result: RankResult = pickle.load(src)
    except (FileNotFoundError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None
    return result


def _root_cause(
    plan: LaunchPlan, results: Dict[int, Optional[RankResult]], exits: _Exits, failed: List[int]
) -> RankFailure:
    """The failure to report: a rank that failed on its own (not one we stopped, not one that only
    lost its peers), the earliest first."""

    def own_failure(rank: int) -> bool:
        # A rank counted as stopped may have died on its own before its exit was seen (a segfault or
        # SIGKILL whose peer's "connection closed" exit came in first): with no result, an exit that no
        # signal the launcher sent explains is its own failure.
        result = results[rank]
        code = exits.codes.get(rank)
        if result is None and code is not None and -code not in exits.signals_sent:
            return True
        return not exits.stopped.get(rank) or (result is not None and not result.ok)

    def when(rank: int) -> float:
        result = results[rank]
        return result.finished_at if result is not None else exits.seen_at.get(rank, float("inf"))

    candidates = [r for r in failed if own_failure(r)] or failed
    primary = [r for r in candidates if not (results[r] and results[r].is_secondary)]  # type: ignore[union-attr]
    rank = min(primary or candidates, key=when)
    result = results[rank]
    code = exits.codes.get(rank)
    log_file = plan.log_file(rank)
    if result is not None and not result.ok:
        error_type, message, text = result.error_type, result.error_message, result.traceback
    else:
        error_type, message = _describe_exit(code)
        text = _tail(log_file)
    failure = RankFailure(
        rank=rank,
        node=plan.node_rank,
        exit_code=code,
        error_type=error_type,
        error_message=message,
        traceback_text=text,
        log_file=str(log_file),
        results=[results.get(r) for r in plan.global_ranks],
        exit_codes=exits.codes,
    )
    original = result.original_exception() if result is not None else None
    failure.__cause__ = original
    return failure


def _describe_exit(code: Optional[int]) -> tuple:
    if code is None:
        return "RankLost", "the rank ended without an exit status"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "RankKilled", f"killed by {name} (exit code {code})"
    if code == 0:
        return "RankLost", "exited with code 0 but sent no result"
    return "RankExited", f"exited with code {code} before returning"


def _tail(log_file: Path) -> str:
    try:
        lines = log_file.read_text(errors="backslashreplace").splitlines()
    except FileNotFoundError:
        return ""
    if not lines:
        return ""
    return f"last lines of {log_file.name}:\n" + "\n".join(lines[-_LOG_TAIL_LINES:])
