"""Starts the ranks of one node, waits for them, stops them all on the first failure, and names the
root cause."""

from __future__ import annotations

import os
import pickle
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ddpw_runtime.payload import RankPayload
from ddpw_runtime.plan import LaunchPlan
from ddpw_runtime.results import RankFailure, RankResult
from ddpw_runtime.starter import RankStarter

_LOG_TAIL_LINES = 40


@dataclass
class _Exits:
    codes: Dict[int, int] = field(default_factory=dict)
    seen_at: Dict[int, float] = field(default_factory=dict)
    stopped: Dict[int, bool] = field(default_factory=dict)
    """Ranks that were still running when the job was stopped."""


def run_node(
    starter: RankStarter,
    payload: RankPayload,
    payload_path: Path,
    stop_grace_s: float,
    local_ranks: Optional[Sequence[int]] = None,
    on_start: Optional[Callable[[int], None]] = None,
    listen_fd: Optional[int] = None,
) -> List[RankResult]:
    """Run the ranks of `payload.plan` on this node; their results in rank order, or RankFailure.

    `local_ranks` limits which of the node's ranks are started (the others run elsewhere, such as in
    the caller); `on_start(pid)` is called as each one starts. `listen_fd`, the bound rendezvous
    socket, goes to global rank 0 (which hosts the store).
    """
    plan = payload.plan
    first = plan.global_ranks[0]
    ranks = plan.global_ranks if local_ranks is None else [first + local_rank for local_rank in local_ranks]
    pids: Dict[int, int] = {}
    exits = _Exits()
    try:
        for rank in ranks:
            pid = starter.start(str(payload_path), rank - first, listen_fd if rank == 0 else None)
            pids[pid] = rank
            if on_start is not None:
                on_start(pid)
        _wait(starter, pids, exits, stop_grace_s)
    except BaseException:
        _stop(starter, pids, exits, grace_s=0.0 if not pids else stop_grace_s)
        raise
    results = {rank: _read_result(payload, rank) for rank in ranks}
    failed = [r for r in ranks if exits.codes.get(r) != 0 or not (results[r] and results[r].ok)]
    if failed:
        raise _root_cause(plan, results, exits, failed)
    return [results[r] for r in ranks]  # type: ignore[misc]


def _wait(starter: RankStarter, pids: Dict[int, int], exits: _Exits, stop_grace_s: float) -> None:
    """Wait for every rank; on the first non-zero exit, stop the others (SIGTERM, then SIGKILL)."""
    deadline: Optional[float] = None
    while len(exits.codes) < len(pids):
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        event = starter.next_exit(timeout)
        if event is None:
            _signal_running(pids, exits, signal.SIGKILL)
            deadline = None
            continue
        pid, code = event
        rank = pids[pid]
        exits.codes[rank] = code
        exits.seen_at[rank] = time.time()
        if code != 0 and deadline is None and not exits.stopped:
            for other in pids.values():
                if other not in exits.codes:
                    exits.stopped[other] = True
            _signal_running(pids, exits, signal.SIGTERM)
            deadline = time.monotonic() + stop_grace_s


def _stop(starter: RankStarter, pids: Dict[int, int], exits: _Exits, grace_s: float) -> None:
    """Stop every running rank (after an error in the controller itself) and wait for them."""
    for rank in pids.values():
        if rank not in exits.codes:
            exits.stopped[rank] = True
    _signal_running(pids, exits, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while len(exits.codes) < len(pids):
        event = starter.next_exit(max(0.0, deadline - time.monotonic()))
        if event is None:
            _signal_running(pids, exits, signal.SIGKILL)
            deadline = float("inf")
            continue
        exits.codes[pids[event[0]]] = event[1]


def _signal_running(pids: Dict[int, int], exits: _Exits, sig: int) -> None:
    for pid, rank in pids.items():
        if rank not in exits.codes:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


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
        result = results[rank]
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
