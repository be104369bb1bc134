"""`Wrapper` and `@wrapper` without Hydra: values by rank, failures, upon_finish, caller_rank,
task_context and threads per rank; real ranks on gloo."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ddpw_runtime
from ddpw_runtime import ConfigError, JobTimedOut, Layout, Platform, RankFailure, Wrapper, _compat, wrapper
from tests.helpers import APPS, alive, started_with

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes

TWO = Platform(n_procs_per_node=2)
FINISHED: list[int] = []


def record_finish() -> None:
    """The `upon_finish` of the tests: counts its calls in the caller."""
    FINISHED.append(os.getpid())


def who(x: int, y: int = 0) -> tuple:
    print(f"rank {ddpw_runtime.rank()} says {x + y}")
    return ddpw_runtime.rank(), ddpw_runtime.world_size(), x + y, os.getpid()


def write_pid_then_fail_on(rank: int, folder: str) -> None:
    Path(folder, f"pid_{ddpw_runtime.rank()}").write_text(str(os.getpid()))
    ddpw_runtime.barrier()
    if ddpw_runtime.rank() == rank:
        raise KeyError("missing thing")
    ddpw_runtime.barrier()


@wrapper(TWO)
def decorated_at_module_level(x: int) -> int:
    """A decorated function importable by reference: must run its body on the ranks, not start a job."""
    return 100 * ddpw_runtime.rank() + x


def test_start_returns_every_rank_value_indexed_by_rank(tmp_path: Path) -> None:
    values = Wrapper(TWO, log_dir=tmp_path).start(who, 3, y=4)
    assert [v[:3] for v in values] == [(0, 2, 7), (1, 2, 7)]
    assert values[0][3] != values[1][3] != os.getpid()
    assert "rank 1 says 7" in (tmp_path / "rank_1.log").read_text()


def test_an_argument_that_cannot_be_sent_to_the_ranks_is_named_before_any_starts(tmp_path: Path) -> None:
    runner = Wrapper(Platform(n_procs_per_node=2), log_dir=tmp_path / "logs")
    with pytest.raises(TypeError, match=r"the task's kwargs\['y'\] \(<unlocked _thread.lock object at .*\) cannot be "
                                        r"sent to the ranks \(TypeError: cannot pickle '_thread.lock' object\): make "
                                        "it inside the task"):
        runner.start(who, 1, y=threading.Lock())
    assert not list((tmp_path / "logs").glob("rank_*.log"))  # no rank started


def start_a_job_inside() -> None:
    """A task that starts a job of its own (a `@wrapper` function called inside a rank)."""
    Wrapper(TWO).start(who, 1)


def test_a_job_started_inside_a_rank_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(RankFailure) as failure:
        Wrapper(TWO, log_dir=tmp_path).start(start_a_job_inside)
    assert "ConfigError: Wrapper.start(target)='who': called inside a rank of a running job, which starts no job " \
           "of its own: call the function itself here" in str(failure.value)


def test_default_log_dir_is_a_new_folder_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = Wrapper(Platform())
    runner.start(who, 1)
    first = runner.last_log_dir
    runner.start(who, 2)
    assert first is not None and runner.last_log_dir is not None and first != runner.last_log_dir
    assert first.parent == runner.last_log_dir.parent == tmp_path / "ddpw_logs"
    assert "rank 0 says 1" in (first / "rank_0.log").read_text()
    assert "rank 0 says 2" in (runner.last_log_dir / "rank_0.log").read_text()


def test_decorator_returns_every_rank_value(tmp_path: Path) -> None:
    @wrapper(TWO, log_dir=tmp_path)
    def plus_rank(x: int) -> int:
        return x + ddpw_runtime.rank()

    assert plus_rank(10) == [10, 11]
    assert plus_rank.__name__ == "plus_rank"
    assert plus_rank.wrapper.last_log_dir == tmp_path.resolve()  # type: ignore[attr-defined]


def test_decorated_module_function_runs_once_per_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert decorated_at_module_level(5) == [5, 105]


def test_failure_raises_rank_failure_naming_the_root_cause(tmp_path: Path) -> None:
    with pytest.raises(RankFailure) as info:
        Wrapper(TWO, log_dir=tmp_path).start(write_pid_then_fail_on, 1, str(tmp_path))
    failure = info.value
    assert failure.rank == 1 and failure.error_type == "KeyError"
    assert isinstance(failure.__cause__, KeyError) and failure.__cause__.args == ("missing thing",)
    assert "in write_pid_then_fail_on" in str(failure) and 'raise KeyError("missing thing")' in str(failure)
    # Its traceback in the caller goes no deeper than `start`: the engine's frames would tell a user nothing.
    assert [frame.name for frame in traceback.extract_tb(info.tb)][-1:] == ["start"]
    pids = [int((tmp_path / f"pid_{rank}").read_text()) for rank in (0, 1)]
    assert not any(alive(pid) for pid in pids)


def rank_0_returns_early(ddp: bool) -> int:
    """Rank 0 returns while rank 1 waits for it in an all_reduce (with `ddp`, after a DDP step)."""
    import torch
    import torch.distributed as dist

    if ddp:
        ddpw_runtime.wrap_model(torch.nn.Linear(2, 1))(torch.ones(1, 2)).sum().backward()
    if ddpw_runtime.rank() == 1:
        dist.all_reduce(torch.ones(1))
    return ddpw_runtime.rank()


@pytest.mark.parametrize("ddp", [False, True], ids=["plain", "ddp"])
def test_rank_0_returning_while_rank_1_waits_for_it_is_named_as_the_cause(tmp_path: Path, ddp: bool) -> None:
    # Rank 0 held the job's store until every rank was done with it, so rank 1 waited out its collective timeout (30
    # minutes, the default here). That was reported as rank 1's own failure, the bare gloo timeout, or as rank 0 NOT IN
    # THE COLLECTIVE "at" the caller's `start` line, inside the store's wait.
    platform = Platform(n_procs_per_node=2)
    with pytest.raises(RankFailure) as info:
        Wrapper(platform, log_dir=tmp_path).start(rank_0_returns_early, ddp)
    failure = info.value
    lines, first = inspect.getsourcelines(rank_0_returns_early)
    line = first + next(i for i, text in enumerate(lines) if "dist.all_reduce" in text)
    assert (failure.rank, failure.error_type) == (0, "EndedEarly"), str(failure)
    assert (f"rank 0 (node 0) failed: EndedEarly: its task returned while rank 1 still waited for it in a collective "
            f"at rank_0_returns_early ({__file__}:{line})") in str(failure), str(failure)
    assert "what a waiting rank raised (secondary): rank 1: RuntimeError: " in str(failure)


def test_upon_finish_runs_once_in_the_caller_after_success_only(tmp_path: Path) -> None:
    platform = Platform(n_procs_per_node=2, upon_finish="tests.test_wrapper:record_finish")
    FINISHED.clear()
    Wrapper(platform, log_dir=tmp_path).start(who, 1)
    assert FINISHED == [os.getpid()]
    with pytest.raises(RankFailure):
        Wrapper(platform, log_dir=tmp_path).start(write_pid_then_fail_on, 0, str(tmp_path))
    assert FINISHED == [os.getpid()]


def threads() -> tuple:
    """A rank's torch threads and its `OMP_NUM_THREADS`."""
    import torch

    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]


def test_threads_per_rank_split_n_cpus_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert Wrapper(Platform(n_procs_per_node=1, n_cpus_per_node=1), log_dir=tmp_path).start(threads) == [(1, "1")]
    assert Wrapper(Platform(n_procs_per_node=2, n_cpus_per_node=2), log_dir=tmp_path).start(threads) == [(1, "1")] * 2


def test_omp_num_threads_the_user_set_is_kept_as_torchrun_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert Wrapper(Platform(n_procs_per_node=2, n_cpus_per_node=2), log_dir=tmp_path).start(threads) == [(3, "3")] * 2


@contextmanager
def marked(name: str) -> Iterator[None]:
    """A task context: sets DDPW_TEST_CONTEXT=<name>:<rank> while the task runs."""
    os.environ["DDPW_TEST_CONTEXT"] = f"{name}:{ddpw_runtime.rank()}"
    try:
        yield
    finally:
        del os.environ["DDPW_TEST_CONTEXT"]


def read_mark() -> str:
    return os.environ.get("DDPW_TEST_CONTEXT", "unset")


def test_task_context_is_entered_around_the_task_on_every_rank(tmp_path: Path) -> None:
    runner = Wrapper(TWO, log_dir=tmp_path, task_context=lambda: marked("ctx"))
    assert runner.start(read_mark) == ["ctx:0", "ctx:1"]


def test_task_context_is_left_after_the_task(tmp_path: Path) -> None:
    runner = Wrapper(TWO, log_dir=tmp_path, caller_rank=True, task_context=lambda: marked("ctx"))
    assert runner.start(read_mark) == ["ctx:0", "ctx:1"]
    assert "DDPW_TEST_CONTEXT" not in os.environ


def train_in_place(model: Any, steps: int) -> Any:
    import torch

    ddp = ddpw_runtime.wrap_model(model)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(ddpw_runtime.rank())
    for _ in range(steps):
        x = torch.randn(16, 2, generator=generator)
        loss = ((ddp(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return threading.Lock() if ddpw_runtime.rank() == 0 else os.getpid()


def test_caller_rank_trains_the_callers_own_model(tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    threads = torch.get_num_threads()
    excepthook = sys.excepthook
    values = Wrapper(TWO, log_dir=tmp_path, caller_rank=True).start(train_in_place, model, 50)
    assert isinstance(values[0], type(threading.Lock()))  # rank 0's value itself, never pickled
    assert not alive(values[1])
    assert not torch.equal(model.weight, before)
    torch.testing.assert_close(model.weight.detach(), torch.ones(1, 2), atol=0.05, rtol=0)
    assert not dist.is_initialized()
    assert "RANK" not in os.environ and "TORCHELASTIC_USE_AGENT_STORE" not in os.environ
    assert torch.get_num_threads() == threads
    assert sys.excepthook is excepthook
    with pytest.raises(RuntimeError, match="not inside a rank"):
        ddpw_runtime.rank()


def test_caller_rank_runs_rank_zero_in_this_process_and_again(tmp_path: Path) -> None:
    runner = Wrapper(TWO, log_dir=tmp_path, caller_rank=True)
    for x in (1, 2):
        values = runner.start(who, x)
        assert [v[:3] for v in values] == [(0, 2, x), (1, 2, x)]
        assert values[0][3] == os.getpid() != values[1][3]


ONE_RANK_IN_THE_CALLER = """
import os
from pathlib import Path
from ddpw_runtime import Platform, Wrapper

def children() -> list[str]:
    return [pid for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]

if __name__ == "__main__":
    print("children", Wrapper(Platform(n_procs_per_node=1), caller_rank=True).start(children))
"""


def test_caller_rank_with_one_rank_starts_no_process(tmp_path: Path) -> None:
    """As the ddpw package does with one rank: the task runs in the caller, and nothing else is started."""
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK_IN_THE_CALLER)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "children [[]]" in done.stdout


AS_PYTHON_EXITS = """
import atexit, os, threading
from ddpw_runtime import Platform, Wrapper

def no_new_thread(*args, **kwargs):
    raise RuntimeError("can't create new thread at interpreter shutdown")

if __name__ == "__main__":
    print("starter", *set(Wrapper(Platform(n_procs_per_node=2)).start(os.getppid)))
    atexit.register(setattr, threading.Thread, "start", no_new_thread)  # (runs before hydra-ddpw's exit handlers)
"""


def test_the_rank_starter_is_closed_as_python_exits_without_a_new_thread(tmp_path: Path) -> None:
    """Python 3.12 and later refuse a new thread while the program exits, where the rank starter is closed (every
    Wrapper call, every multirun): the close starts none. The refusal is made here as 3.12 makes it, so that the
    test can fail on any Python."""
    script = tmp_path / "as_python_exits.py"
    script.write_text(AS_PYTHON_EXITS)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    starter = int(done.stdout.split("starter ")[1].split()[0])
    assert not alive(starter)


def raise_given_on_rank_0(error: Exception, folder: str) -> None:
    Path(folder, f"pid_{ddpw_runtime.rank()}").write_text(str(os.getpid()))
    ddpw_runtime.barrier()
    if ddpw_runtime.rank() == 0:
        raise error
    ddpw_runtime.barrier()


def test_caller_rank_failure_on_rank_zero_stops_the_others(tmp_path: Path) -> None:
    error = ValueError("rank 0 broke")
    runner = Wrapper(TWO, log_dir=tmp_path, caller_rank=True)
    with pytest.raises(RankFailure) as info:
        runner.start(raise_given_on_rank_0, error, str(tmp_path))
    failure = info.value
    assert failure.rank == 0 and failure.__cause__ is error
    assert failure.results[1] is None or not failure.results[1].ok  # stopped, or lost its peer
    assert not alive(int((tmp_path / "pid_1").read_text()))
    assert [v[0] for v in runner.start(who, 0)] == [0, 1]


def test_caller_rank_does_not_wait_for_a_rank_that_failed_before_joining(tmp_path: Path) -> None:
    """Rank 1 cannot open its log file (a folder is in the way), so it ends before it joins the process
    group; rank 0, in this process and waiting for it to join, is stopped, and the next call runs."""
    (tmp_path / "rank_1.log").mkdir()
    runner = Wrapper(TWO, log_dir=tmp_path, caller_rank=True)
    with pytest.raises(RankFailure) as info:
        runner.start(who, 0)
    failure = info.value
    assert failure.rank == 1 and "exited with code 1 before returning" in str(failure)
    assert failure.outcomes[0].stopped  # rank 0, still joining, was stopped: not a cause
    (tmp_path / "rank_1.log").rmdir()
    assert [v[0] for v in runner.start(who, 0)] == [0, 1]


def test_bad_platform_fails_when_the_wrapper_is_made() -> None:
    with pytest.raises(ConfigError, match=r"platform\.layout\.tensor=3"):
        Wrapper(Platform(n_procs_per_node=2, layout=Layout(tensor=3)))
    with pytest.raises(ConfigError, match=r"platform\.ipc_protocol='file'.*caller_rank"):
        Wrapper(Platform(n_procs_per_node=2, ipc_protocol="file"), caller_rank=True)
    with pytest.raises(ConfigError, match=r"platform\.n_nodes=2: a Wrapper runs every rank on this machine; use "
                       r"n_nodes=1 \(a job across machines runs from a Hydra app"):
        Wrapper(Platform(n_nodes=2))
    # A misspelt field is named with the nearest one (not a dataclass's bare TypeError).
    with pytest.raises(ConfigError, match=r"platform\.n_proc_per_node=2: Platform has no such field; did you mean "
                       "n_procs_per_node?"):
        Platform(n_proc_per_node=2)  # type: ignore[call-arg]


@pytest.mark.parametrize("field, guess", [("n_gpus", "n_gpus_per_node"), ("n_cpus", "n_cpus_per_node"),
                                          ("ram", "mem_per_node")])
def test_a_field_of_the_ddpw_packages_platform_is_answered_with_its_name_here(field: str, guess: str) -> None:
    # `ddpw`'s Platform(n_gpus=4, n_cpus=32, ram=64): `ram` was answered "did you mean slurm_additional_parameters?"
    # (the letters r-a-m inside "parameters").
    with pytest.raises(ConfigError) as info:
        Platform(**{field: 4})  # type: ignore[arg-type]
    assert str(info.value).startswith(f"platform.{field}=4: Platform has no such field; did you mean {guess}? ")
    assert "did you mean slurm_additional_parameters" not in str(info.value)


PYTHON_C = """
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

def square(x):
    return (ddpw_runtime.rank(), x * x)
print(Wrapper(Platform(n_procs_per_node=2), log_dir="logs").start(square, 7))
"""


def test_works_from_python_c(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PYTHON_C], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert "[(0, 49), (1, 49)]" in done.stdout


FROM_THREADS_THAT_END = """
import asyncio
from concurrent.futures import ThreadPoolExecutor
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

def square(x):
    return (ddpw_runtime.rank(), x * x)

def call(caller_rank):
    return Wrapper(Platform(n_procs_per_node=2), log_dir="logs", caller_rank=caller_rank).start(square, 3)

for caller_rank in (True, False):  # each call from a thread of a pool of its own, which ends after it
    with ThreadPoolExecutor(1) as pool:
        print(pool.submit(call, caller_rank).result())
print(asyncio.run(asyncio.to_thread(call, False)))
print(call(False))
"""


def test_calls_from_threads_that_end_find_the_rank_starter_again(tmp_path: Path) -> None:
    """A `Wrapper` called from a worker thread (a thread pool, `asyncio.to_thread`) that then ends: the next calls, from
    other threads and from the main thread, run. The rank starter dies with the thread that started it (the kernel's
    PR_SET_PDEATHSIG follows that thread), and the second call failed with StarterGone."""
    done = subprocess.run([sys.executable, "-c", FROM_THREADS_THAT_END], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[(0, 9), (1, 9)]"] * 4, done.stdout + done.stderr


AFTER_A_FORK_EXITS = """
import os, sys
import torch.distributed as dist
from ddpw_runtime import Platform, Wrapper

def starter():
    dist.barrier()
    return os.getppid()  # the rank starter that started this rank

if __name__ == "__main__":
    runner = Wrapper(Platform(n_procs_per_node=2), log_dir="logs")
    first = runner.start(starter)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # through Python's exit handlers
    os.waitpid(pid, 0)
    print(first == runner.start(starter), len(set(first)))
"""


def test_a_fork_that_exits_leaves_its_parents_rank_starter_alone(tmp_path: Path) -> None:
    """A fork of the program exits through Python's exit handlers after a `Wrapper` call (as a script's own `os.fork()`
    child may): the program's rank starter is its parent's, and the next call uses it. The fork's exit handlers closed
    it (its channel is shared), and the next call started another."""
    done = subprocess.run([sys.executable, "-c", AFTER_A_FORK_EXITS], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True 1\n", done.stdout + done.stderr


VALUES_FROM_A_SCRIPT = """
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

class Point:
    def __init__(self, x):
        self.x = x

    def __repr__(self):
        return f"Point({self.x})"

class RefusesPickling:
    def __reduce__(self):
        raise TypeError("this value refuses pickling")

    def __repr__(self):
        return "RefusesPickling()"

def task(kind):
    return Point(ddpw_runtime.rank()) if kind == "point" else RefusesPickling()

if __name__ == "__main__":
    for caller_rank in (False, True):
        runner = Wrapper(Platform(n_procs_per_node=2, spawn_method="spawn"), log_dir="logs", caller_rank=caller_rank)
        print(runner.start(task, "point"))
        print(runner.start(task, "refuses"))
"""


def test_values_of_a_script_class_or_that_refuse_pickling_come_back(tmp_path: Path) -> None:
    (tmp_path / "values.py").write_text(VALUES_FROM_A_SCRIPT)
    done = subprocess.run([sys.executable, "values.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == lines[2] == "[Point(0), Point(1)]"
    refused = "'RefusesPickling() (not picklable: this value refuses pickling)'"
    assert lines[1] == f"[{refused}, {refused}]"
    assert lines[3] == f"[RefusesPickling(), {refused}]"  # rank 0 ran in the caller: the object itself


def hang_on_every_rank() -> None:
    while True:
        threading.Event().wait(1.0)


@pytest.mark.parametrize("n_procs", [1, 2])
def test_caller_rank_hanging_past_the_time_limit_is_stopped(tmp_path: Path, n_procs: int) -> None:
    runner = Wrapper(Platform(n_procs_per_node=n_procs, timeout_min=0.02), log_dir=tmp_path, caller_rank=True)
    with pytest.raises(JobTimedOut) as info:
        runner.start(hang_on_every_rank)
    assert "time limit" in str(info.value)
    # Rank 0, placed where it hung in the caller, is not also said to have ended (it was, as the other ranks' report
    # counted it: not one of their processes).
    assert "had ended" not in str(info.value) and str(info.value).count("\n  rank 0: ") == 1, str(info.value)
    assert info.value.report is None or info.value.report.ended == ()
    assert [v[0] for v in runner.start(who, 3)] == list(range(n_procs))  # and the caller can run the next job


def test_a_stall_report_places_the_callers_rank_0_where_it_is(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The report a stall prints (and the one a `where` request gets) said `rank 0: had ended` of a caller's rank 0
    still in its task: the supervisor looked only at the ranks it started."""
    runner = Wrapper(Platform(n_procs_per_node=2, stall_timeout_min=0.02, stop_on_stall=True), log_dir=tmp_path,
                     caller_rank=True)
    with pytest.raises(JobTimedOut) as info:
        runner.start(hang_on_every_rank)
    console = capfd.readouterr()
    printed = console.out + console.err
    assert "[ddpw]   rank 0: at hang_on_every_rank (" in printed, printed
    assert "had ended" not in printed + str(info.value), printed + str(info.value)
    assert info.value.stalled and str(info.value).count("\n  rank 0: ") == 1, str(info.value)


INTERRUPTED_THEN_AGAIN = """
import faulthandler, os, signal, sys, threading, time
from ddpw_runtime import Platform, Wrapper

faulthandler.dump_traceback_later(150, exit=True)  # a hang ends with every thread's stack (it takes ~5 s)

def wait_forever():
    while True:
        time.sleep(1)

def rank_and_value(x):
    import ddpw_runtime
    return (ddpw_runtime.rank(), x)

caller_rank = sys.argv[1] == "caller"
runner = Wrapper(Platform(n_procs_per_node=2), log_dir="logs", caller_rank=caller_rank)
for after_s in (0.0, 0.01, 0.05, 0.2, 0.5, 1.5):
    try:
        threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGINT)).start()  # the moment Ctrl-C comes
        runner.start(wait_forever)
    except KeyboardInterrupt as interrupted:
        print("interrupted:", type(interrupted).__name__, flush=True)
    print(runner.start(rank_and_value, after_s), flush=True)
    # the process is as it was: its own Ctrl-C handler, nothing blocked
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, ()), signal.pthread_sigmask(signal.SIG_BLOCK, ())
"""


@pytest.mark.parametrize("where", ["caller", "ranks"])
def test_a_wrapper_interrupted_at_any_moment_runs_again(tmp_path: Path, where: str) -> None:
    (tmp_path / "again.py").write_text(INTERRUPTED_THEN_AGAIN)
    done = subprocess.run([sys.executable, "again.py", where], cwd=tmp_path, capture_output=True, text=True,
                          timeout=200, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines.count("interrupted: KeyboardInterrupt") == 6, done.stdout
    for after_s in (0.0, 0.01, 0.05, 0.2, 0.5, 1.5):
        assert f"[(0, {after_s}), (1, {after_s})]" in lines, done.stdout


TERMINATED = """
import os, signal
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

def sigterm_then_wait():
    if ddpw_runtime.rank() == 1:
        os.kill(int(os.environ["CALLER_PID"]), signal.SIGTERM)
    ddpw_runtime.barrier()

os.environ["CALLER_PID"] = str(os.getpid())
runner = Wrapper(Platform(n_procs_per_node=2), log_dir="logs", caller_rank={caller_rank})
try:
    runner.start(sigterm_then_wait)
except ddpw_runtime.Terminated as stopped:
    print("terminated:", stopped.code, flush=True)
print(runner.start(ddpw_runtime.rank), flush=True)
"""


@pytest.mark.parametrize("caller_rank", [False, True], ids=["ranks", "caller"])
def test_sigterm_during_start_raises_the_public_terminated_and_the_wrapper_runs_again(
    tmp_path: Path, caller_rank: bool
) -> None:
    """SIGTERM to the caller during `start` stops every rank and raises `ddpw_runtime.Terminated` (a `SystemExit`
    with code 143), which a script can catch by its public name; the same `Wrapper` runs again."""
    (tmp_path / "terminated.py").write_text(TERMINATED.format(caller_rank=caller_rank))
    done = subprocess.run([sys.executable, "terminated.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # (the console also shows how rank 0 ended, from its log)
    assert "terminated: 143" in lines and lines[-1] == "[0, 1]", done.stdout + done.stderr


CTRL_C_IGNORED = """
import os, signal
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

def ctrl_c_then_rank():
    if ddpw_runtime.rank() == 0:  # the caller: this program was started ignoring Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)
    ddpw_runtime.barrier()
    return ddpw_runtime.rank()

print(Wrapper(Platform(n_procs_per_node=2), log_dir="logs", caller_rank=True).start(ctrl_c_then_rank), flush=True)
assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # and still is
"""


def test_a_caller_started_ignoring_ctrl_c_keeps_ignoring_it_while_it_is_rank_0(tmp_path: Path) -> None:
    """As a script's background command (`cmd &`): Python keeps SIGINT ignored, and so does the caller's rank."""
    (tmp_path / "ignored.py").write_text(CTRL_C_IGNORED)
    with started_with(signal.SIGINT, signal.SIG_IGN):
        done = subprocess.Popen([sys.executable, "ignored.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    stdout, stderr = done.communicate(timeout=120)
    assert done.returncode == 0, stderr
    assert stdout.splitlines() == ["[0, 1]"], stdout


def fail_on_rank_1_until(attempt: int) -> tuple:
    if ddpw_runtime.rank() == 1 and ddpw_runtime.restart_count() < attempt:
        raise ValueError(f"attempt {ddpw_runtime.restart_count()} fails")
    return ddpw_runtime.restart_count(), ddpw_runtime.run_id()


@pytest.mark.parametrize("caller_rank", [False, True], ids=["ranks", "caller"])
def test_a_failed_call_starts_again_until_restarts_run_out(tmp_path: Path, caller_rank: bool) -> None:
    """Each attempt is marked in the rank logs, and no stacks file or flight-recorder dump of an earlier attempt or
    job in the same log dir is left to pass for this run's."""
    stale = [tmp_path / "stacks_rank_0.txt", tmp_path / "fr_rank_1"]
    for path in stale:
        path.write_text("an earlier job's\n")
    (tmp_path / "rank_1.log").write_text("an earlier job's line\n")
    runner = Wrapper(TWO, log_dir=tmp_path, caller_rank=caller_rank, max_restarts=2)
    values = runner.start(fail_on_rank_1_until, 2)
    assert [v[0] for v in values] == [2, 2] and values[0][1] == values[1][1]  # third attempt, one run id
    assert not [path for path in stale if path.exists()]
    log = (tmp_path / "rank_1.log").read_text()
    marks = ["an earlier job's line", "a new run of the job starts (above: an earlier run's output) ---",
             "attempt 0 fails", "restart 1 of 2: the job starts again ---", "attempt 1 fails",
             "restart 2 of 2: the job starts again ---"]
    assert [log.index(mark) for mark in marks] == sorted(log.index(mark) for mark in marks), log
    with pytest.raises(RankFailure) as info:
        runner.start(fail_on_rank_1_until, 3)
    assert info.value.rank == 1 and "attempt 2 fails" in str(info.value)  # the last attempt's cause


def stopped_in_an_import() -> int | None:
    """Rank 1 fails on the first attempt as the stop of rank 0 lands inside its import of `stopped_in_import`; on the
    next, rank 0 reads the submodule that package imported."""
    import torch.distributed as dist

    if ddpw_runtime.rank() == 1:
        if ddpw_runtime.restart_count() == 0:
            dist.barrier()
            raise ValueError("the first attempt fails")
        return None
    import stopped_in_import

    while ddpw_runtime.restart_count() == 0:
        signal.pause()
    return int(stopped_in_import.part.VALUE)


def test_the_callers_rank_0_stopped_inside_an_import_runs_the_next_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller, rank 0, runs the next attempt: a stop raised inside its import left the package without its
    submodule (`AttributeError` there); it waits for the import to end."""
    monkeypatch.syspath_prepend(str(APPS))
    assert Wrapper(TWO, log_dir=tmp_path, caller_rank=True, max_restarts=1).start(stopped_in_an_import) == [42, None]


def import_torch_checkpointing() -> bool:
    """Whether torch.distributed.checkpoint was loaded before this task imported it."""
    loaded = "torch.distributed.checkpoint" in sys.modules
    import torch.distributed.checkpoint  # noqa: F401

    return loaded


def draw_random_numbers() -> tuple[float, float, float]:
    import random

    import numpy
    import torch

    return random.random(), float(numpy.random.rand()), float(torch.rand(1))


@pytest.mark.parametrize("caller_rank", [False, True])
def test_every_rank_starts_with_pythons_numpys_and_torchs_generators_seeded(tmp_path: Path, caller_rank: bool) -> None:
    """`platform.seed` seeds `random`, numpy and torch on every rank, as the same seeds would in one process."""
    import random

    import numpy
    import torch

    random.seed(7)
    numpy.random.seed(7)
    torch.manual_seed(7)
    expected = draw_random_numbers()
    values = Wrapper(Platform(n_procs_per_node=2, seed=7), log_dir=tmp_path, caller_rank=caller_rank).start(
        draw_random_numbers)
    assert values == [expected, expected]


def test_the_next_calls_ranks_find_the_torch_modules_the_last_ones_imported(tmp_path: Path) -> None:
    """On a torch build without GPU support, the rank starter imports the torch modules a call's ranks
    imported, so the next call's ranks start with them. On a build with GPU support (CUDA, ROCm) it
    imports nothing more once started (more imports there could initialise the GPU runtime before it
    forks ranks): every call's ranks import their own."""
    runner = Wrapper(Platform(n_procs_per_node=2), log_dir=tmp_path)
    first = runner.start(import_torch_checkpointing)
    assert first == [False, False]  # no rank of this test session imported it before
    preloaded = _compat.torch_without_gpu_support()
    assert runner.start(import_torch_checkpointing) == [preloaded, preloaded]


CALLER_STARTS_SLEEPS = """
import json, os, subprocess, sys, threading
import ddpw_runtime
from ddpw_runtime import Platform, Wrapper

def task(folder):
    own = subprocess.Popen(["sleep", "1000"])
    detached = subprocess.Popen(["sleep", "1001"], start_new_session=True)
    path = os.path.join(folder, f"children_rank_{ddpw_runtime.rank()}.json")
    with open(path + ".tmp", "w") as out:
        json.dump([own.pid, detached.pid], out)
    os.replace(path + ".tmp", path)
    threading.Event().wait()

if __name__ == "__main__":
    Wrapper(Platform(n_procs_per_node=2), log_dir="logs", caller_rank=True).start(task, sys.argv[1])
"""


@pytest.mark.subprocess
def test_a_caller_rank_s_caller_killed_leaves_no_process_of_the_job(tmp_path: Path) -> None:
    """The caller of `Wrapper(caller_rank=True)`, rank 0 itself, dies of SIGKILL: what every rank started, in
    sessions of their own too, goes with the job."""
    import json

    from tests.helpers import wait_for

    (tmp_path / "train.py").write_text(CALLER_STARTS_SLEEPS)
    caller = subprocess.Popen([sys.executable, "train.py", str(tmp_path)], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    files = [tmp_path / f"children_rank_{rank}.json" for rank in (0, 1)]
    wait_for(lambda: all(f.exists() for f in files) or caller.poll() is not None, what="every rank's children")
    assert caller.poll() is None, caller.communicate()
    children = [pid for f in files for pid in json.loads(f.read_text())]
    os.kill(caller.pid, signal.SIGKILL)
    caller.communicate(timeout=30)
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=15, what="every process of the job to end")
