"""The caller as rank 0 (mpify's `caller_rank`): ranks 1..N-1 start as usual, rank 0 runs in the
calling process, so what the task builds on rank 0 (a trained model) stays in the caller's memory.

Rank 0 goes through the same `setup_rank` / `teardown_rank` as every other rank, with the rank's
variables set in `os.environ` only while it runs; afterwards the process group is gone, the caller's
environment and thread count are back as they were, and the next job can start.

The caller hosts the job's TCPStore, as torchrun's agent does (`TORCHELASTIC_USE_AGENT_STORE`), rather
than rank 0's `init_process_group`: when another rank fails before joining, closing the store makes
rank 0's wait fail at once instead of after `platform.timeout_min`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ddpw_conf import ConfigError, Platform
from ddpw_runtime.payload import RankPayload
from ddpw_runtime.plan import LaunchPlan
from ddpw_runtime.results import RankFailure, RankResult
from ddpw_runtime.starter import RankStarter
from ddpw_runtime.supervisor import run_node

AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
"""Every rank connects to the store the caller hosts instead of rank 0 starting one."""


def check(platform: Platform) -> None:
    """Raise ConfigError when the caller cannot be rank 0 of `platform`."""
    if platform.n_nodes != 1:
        raise ConfigError(
            "platform.n_nodes", platform.n_nodes, "caller_rank runs rank 0 in this process, so the job "
            "must run on this machine: use n_nodes=1, or caller_rank=False",
        )
    if platform.ipc_protocol != "tcp":
        raise ConfigError(
            "platform.ipc_protocol", platform.ipc_protocol, "caller_rank hosts the rendezvous store in "
            "this process, which needs the tcp rendezvous: use ipc_protocol=tcp, or caller_rank=False",
        )


def run_with_caller(
    starter: RankStarter,
    payload: RankPayload,
    payload_path: Path,
    stop_grace_s: float,
    listen_fd: int,
    target: Callable[..., Any],
    args: tuple,
    kwargs: Dict[str, Any],
) -> List[RankResult]:
    """Run rank 0 here and the node's other ranks through `starter`; every rank's result in rank
    order (rank 0's value is the object itself, never a copy), or RankFailure naming the root cause.
    The job's store listens on `listen_fd`, the rendezvous socket the engine bound."""
    plan = payload.plan
    store = _StoreHost(plan, listen_fd)
    others = _OtherRanks(starter, payload, payload_path, stop_grace_s, on_failure=store.close)
    try:
        others.start()
        own, error = _run_rank_zero(plan, target, args, kwargs)
        if not own.ok:
            others.stop(stop_grace_s)
        outcome = others.join()
    except BaseException:
        others.stop(stop_grace_s)
        others.join()
        raise
    finally:
        store.close()
    return _results(own, error, outcome)


class _StoreHost:
    """The job's TCPStore server, held by the caller until `close`; it serves on a duplicate of
    `listen_fd` (the store closes its socket when it stops, the engine closes the original)."""

    def __init__(self, plan: LaunchPlan, listen_fd: int) -> None:
        from torch.distributed import TCPStore

        own_fd = os.dup(listen_fd)
        try:
            self._store: Optional[Any] = TCPStore(
                plan.master_addr,
                plan.master_port,
                plan.world_size,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(minutes=plan.platform.collective_timeout_min),
                master_listen_fd=own_fd,
            )
        except BaseException:
            os.close(own_fd)
            raise

    def close(self) -> None:
        """Stop serving; ranks still waiting on the store fail at once."""
        self._store = None


class _OtherRanks:
    """Ranks 1..N-1 of the node, started and supervised by `run_node` on a thread."""

    def __init__(
        self,
        starter: RankStarter,
        payload: RankPayload,
        payload_path: Path,
        stop_grace_s: float,
        on_failure: Callable[[], None],
    ) -> None:
        self._lock = threading.Lock()
        self._pids: List[int] = []
        self._stopping = False
        self._on_failure = on_failure
        self._outcome: Union[List[RankResult], BaseException] = []
        local_ranks = range(1, payload.plan.ranks_per_node)
        self._thread = threading.Thread(
            target=self._supervise,
            args=(starter, payload, payload_path, stop_grace_s, local_ranks),
            name="ddpw-other-ranks",
            daemon=True,
        )

    def start(self) -> None:
        """Start the ranks (on the supervising thread)."""
        self._thread.start()

    def _supervise(
        self, starter: RankStarter, payload: RankPayload, path: Path, grace_s: float, local_ranks: Sequence[int]
    ) -> None:
        try:
            self._outcome = run_node(starter, payload, path, grace_s, local_ranks, on_start=self._started)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread by join()
            self._outcome = exc
            self._on_failure()

    def _started(self, pid: int) -> None:
        with self._lock:
            self._pids.append(pid)
            if self._stopping:
                _signal(pid, signal.SIGTERM)

    def stop(self, grace_s: float) -> None:
        """Stop every rank: SIGTERM, then SIGKILL for those still running after `grace_s`."""
        with self._lock:
            self._stopping = True
            pids = list(self._pids)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        self._thread.join(grace_s)
        if self._thread.is_alive():
            with self._lock:
                pids = list(self._pids)
            for pid in pids:
                _signal(pid, signal.SIGKILL)

    def join(self) -> Union[List[RankResult], BaseException]:
        """Wait for every rank; their results in rank order, or what `run_node` raised."""
        self._thread.join()
        return self._outcome


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # each rank leads its own process group
    except (ProcessLookupError, PermissionError):
        pass


def _run_rank_zero(
    plan: LaunchPlan, target: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]
) -> Tuple[RankResult, Optional[Exception]]:
    """Run the task as rank 0 in this process; its result and, on failure, the exception itself.
    KeyboardInterrupt and other BaseExceptions propagate after the teardown. What joining a job
    changes in the process (rank variables, thread count, the `[rank0]` excepthook that
    init_process_group installs) is put back afterwards."""
    import torch

    from ddpw_runtime.rank_process import from_task, rank_environment, setup_rank, teardown_rank

    variables = {**rank_environment(plan, 0, 0), **AGENT_STORE_ENV}
    saved = {name: os.environ.get(name) for name in variables}
    threads = torch.get_num_threads()
    excepthook = sys.excepthook
    os.environ.update(variables)
    try:
        setup_rank(plan, 0, 0)
        value = target(*args, **kwargs)
        return RankResult(0, True, value=value), None
    except Exception as exc:  # noqa: BLE001 - reported like any other rank's failure
        exc = from_task(exc, _run_rank_zero)
        return RankResult.failure(0, exc), exc
    finally:
        teardown_rank()
        torch.set_num_threads(threads)
        sys.excepthook = excepthook
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _results(
    own: RankResult, error: Optional[Exception], others: Union[List[RankResult], BaseException]
) -> List[RankResult]:
    """Every rank's result, or the RankFailure of the root cause: rank 0 when it failed on its own
    before any other rank did, else the other ranks' root cause."""
    if isinstance(others, BaseException) and not isinstance(others, RankFailure):
        raise others
    failure = others if isinstance(others, RankFailure) else None
    other_results = failure.results[1:] if failure is not None else others
    if not own.ok and (failure is None or (not own.is_secondary and not _failed_before(failure, own))):
        raise _own_failure(own, error, other_results)  # type: ignore[arg-type]
    if failure is not None:
        failure.results[0] = own
        raise failure
    return [own, *other_results]  # type: ignore[misc]


def _failed_before(failure: RankFailure, own: RankResult) -> bool:
    """Whether the other ranks' root cause raised on its own before rank 0 failed."""
    result = failure.results[failure.rank]
    return result is not None and not result.ok and not result.is_secondary and result.finished_at < own.finished_at


def _own_failure(own: RankResult, error: Optional[Exception], others: List[Optional[RankResult]]) -> RankFailure:
    failure = RankFailure(
        rank=0,
        node=0,
        exit_code=None,
        error_type=own.error_type,
        error_message=own.error_message,
        traceback_text=own.traceback,
        log_file=None,
        results=[own, *others],
    )
    failure.__cause__ = error
    return failure
