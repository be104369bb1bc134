"""The engine called directly (no Hydra): return values, failures as data, nothing left running."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ddpw_conf import Platform
from ddpw_runtime import RankFailure
from tests.helpers import alive, run_ranks

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def rank_and_pid(offset: int) -> tuple:
    import ddpw_runtime

    return ddpw_runtime.rank() + offset, os.getpid(), os.getppid()


def returns_a_lock() -> object:
    return threading.Lock()


class OddError(Exception):
    """An exception whose constructor cannot be called again by unpickling."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"odd {a} {b}")


def raises_odd_error_on_rank_1() -> None:
    import torch.distributed as dist

    import ddpw_runtime

    if ddpw_runtime.rank() == 1:
        raise OddError(1, 2)
    dist.barrier()


def raises_on_rank_1() -> None:
    import torch.distributed as dist

    import ddpw_runtime

    if ddpw_runtime.rank() == 1:
        raise KeyError("missing thing")
    dist.barrier()


def test_every_rank_value_comes_back_in_rank_order(tmp_path: Path) -> None:
    values = run_ranks(rank_and_pid, 10, platform=Platform(n_procs_per_node=3), log_dir=tmp_path)
    assert [v[0] for v in values] == [10, 11, 12]
    assert not any(alive(v[1]) for v in values)


def test_unpicklable_value_comes_back_as_text(tmp_path: Path) -> None:
    (value,) = run_ranks(returns_a_lock, platform=Platform(), log_dir=tmp_path)
    assert isinstance(value, str) and "lock" in value and "not picklable" in value


def test_odd_exception_class_comes_back_as_text(tmp_path: Path) -> None:
    with pytest.raises(RankFailure) as info:
        run_ranks(raises_odd_error_on_rank_1, platform=Platform(n_procs_per_node=2), log_dir=tmp_path)
    failure = info.value
    assert failure.rank == 1
    assert failure.error_type.endswith("OddError") and failure.error_message == "odd 1 2"
    assert "raise OddError(1, 2)" in failure.traceback_text


def test_failure_carries_the_original_exception_and_every_result(tmp_path: Path) -> None:
    with pytest.raises(RankFailure) as info:
        run_ranks(raises_on_rank_1, platform=Platform(n_procs_per_node=2), log_dir=tmp_path)
    failure = info.value
    assert isinstance(failure.__cause__, KeyError)
    assert failure.log_file == str(tmp_path / "rank_1.log")
    assert len(failure.results) == 2 and failure.results[1] is not None and not failure.results[1].ok


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_both_start_methods_run_the_ranks(tmp_path: Path, method: str) -> None:
    values = run_ranks(rank_and_pid, 0, platform=Platform(n_procs_per_node=2, spawn_method=method), log_dir=tmp_path)
    assert [v[0] for v in values] == [0, 1]


def test_file_rendezvous_uses_a_private_file_and_removes_it(tmp_path: Path) -> None:
    values = run_ranks(rank_and_pid, 0, platform=Platform(n_procs_per_node=2, ipc_protocol="file"), log_dir=tmp_path)
    assert [v[0] for v in values] == [0, 1]


def test_a_record_written_by_two_processes_at_once_is_whole_and_neither_fails(tmp_path: Path) -> None:
    """Two jobs given one output dir (a Wrapper's fixed log_dir used by two programs at once) both write rank 0's
    flight-recorder file as their rank 0 starts: the second writer's rename found its temporary file gone, moved by
    the first (FileNotFoundError), and its rank failed before its task."""
    import subprocess
    import sys

    path = tmp_path / "record"
    code = ("import sys; from pathlib import Path; from ddpw_runtime.launch.payload import write_atomically\n"
            "for _ in range(3000): write_atomically(Path(sys.argv[1]), sys.argv[2].encode() * 1000)")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(path), mark], stderr=subprocess.PIPE, text=True)
               for mark in "ab"]
    errors = [writer.communicate(timeout=120)[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    assert path.read_text() in ("a" * 1000, "b" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["record"]  # no temporary file left
