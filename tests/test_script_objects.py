"""The user's script in every rank: its functions and classes are the script's own `__main__` objects (as in a
process torchrun starts), and every traceback of the task names the script's file and line and shows the
source line, whichever cloudpickle release is installed, in a plain run, a multirun and with `Wrapper`
(on SLURM: tests/test_slurm.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import APPS, job_dirs, run_app, seen

APP = "script_objects_app.py"


def line_of(path: Path, text: str) -> int:
    """The number of the line of `path` that is `text` (indented)."""
    (number,) = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == text]
    return number


def frame(path: Path, function: str, text: str) -> str:
    """How a traceback shows the frame of `function` at the line of `path` that is `text`."""
    return f'  File "{path}", line {line_of(path, text)}, in {function}\n    {text}\n'


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("-m",), ("-m", "platform.spawn_method=spawn")],
                         ids=["plain", "multirun", "multirun-spawn"])
def test_every_rank_uses_the_scripts_own_class_in_a_spawn_dataloader(tmp_path: Path, mode: tuple[str, ...]) -> None:
    proc = run_app(tmp_path, *mode, app=APP)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    for data in ranks.values():
        assert data["total"] == 28.0  # both ranks' spawned DataLoader workers read the script's Squares
        assert data["same_class"] and data["same_task"]  # the script's objects, not copies


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("-m",), ("-m", "platform.spawn_method=spawn")],
                         ids=["plain", "multirun", "multirun-spawn"])
def test_a_failing_ranks_traceback_names_the_scripts_file_line_and_source(tmp_path: Path,
                                                                          mode: tuple[str, ...]) -> None:
    proc = run_app(tmp_path, *mode, "behaviour=raise", app=APP)
    assert proc.returncode == 1
    app = APPS / APP
    expected = frame(app, "main", "fail_here()") + frame(
        app, "fail_here", 'raise DataError("failed on a line of the script")'
    ) + "DataError: failed on a line of the script\n"  # (named as in the script's own process, also where imported)
    assert expected in proc.stderr
    assert "failed: __main__.DataError: failed on a line of the script" in proc.stderr
    assert "<dynamic-code>" not in proc.stdout + proc.stderr
    (job,) = job_dirs(tmp_path)
    assert expected in (job / "rank_1.log").read_text()


WRAPPER_SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader, Dataset
import ddpw_runtime
from ddpw_runtime import Platform, RankFailure, Wrapper

class Squares(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor(float(index * index))

class Total:
    def __init__(self, value):
        self.value = value

def task(fail):
    if fail and ddpw_runtime.rank() == 1:
        raise ValueError("failed in the script")
    loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    return Total(sum(batch.sum().item() for batch in loader)), sys.modules["__main__"].Squares is Squares

if __name__ == "__main__":
    runner = Wrapper(Platform(n_procs_per_node=2, spawn_method=sys.argv[1]), log_dir="logs")
    print([(type(total) is Total, total.value, same) for total, same in runner.start(task, False)])
    try:
        runner.start(task, True)
    except RankFailure as failure:
        print(failure)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_wrapper_script_s_ranks_use_its_own_objects_and_its_tracebacks_name_it(tmp_path: Path,
                                                                                method: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(WRAPPER_SCRIPT)
    done = subprocess.run([sys.executable, str(script), method], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    # (a rank's helper may add a line of its own, such as the resource tracker's after a rank was stopped)
    assert "[(True, 14.0, True), (True, 14.0, True)]\n" in done.stdout  # the caller's own class comes back
    assert frame(script, "task", 'raise ValueError("failed in the script")') in done.stdout


NO_GUARD = """
import ddpw_runtime
from ddpw_runtime import Platform, RankFailure, Wrapper

def task():
    if ddpw_runtime.rank() == 1:
        raise ValueError("failed in a script without a guard")

print("the script runs")
try:
    Wrapper(Platform(n_procs_per_node=2, spawn_method="spawn"), log_dir="logs").start(task)
except RankFailure as failure:
    print(failure)
"""


@pytest.mark.subprocess
def test_a_script_without_a_main_guard_is_not_run_again_and_its_tracebacks_still_name_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(NO_GUARD)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("the script runs") == 1  # its functions travel by value: no rank runs it again
    assert "the script runs" not in "".join(p.read_text() for p in (tmp_path / "logs").glob("rank_*.log"))
    assert frame(script, "task", 'raise ValueError("failed in a script without a guard")') in done.stdout


def test_the_script_s_functions_and_classes_travel_by_reference_and_the_rest_keeps_its_file(tmp_path: Path) -> None:
    """In a fresh interpreter (as a SLURM node or a spawned rank), what the script pickled finds the script's own
    objects (imported as `__mp_main__`, its guarded block not run), and a function of no module keeps its file."""
    script = tmp_path / "train.py"
    script.write_text(
        "import pickle, sys\n"
        "from ddpw_runtime.launch import pickling\n"
        "class Point:\n    pass\n"
        "def task():\n    return Point\n"
        "def make_local():\n    def local():\n        return 1 / 0\n    return local\n"
        "if __name__ == '__main__':\n"
        "    sys.stdout.buffer.write(pickling.dumps((task, Point(), make_local())))\n"
    )
    blob = subprocess.run([sys.executable, str(script)], capture_output=True, check=True, timeout=60).stdout
    (tmp_path / "blob").write_bytes(blob)
    reader = (
        "import pickle, sys, traceback\n"
        "task, point, local = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "main = sys.modules['__main__']\n"
        "print(task is main.task, type(point) is main.Point, task() is main.Point, main.__name__)\n"
        "try:\n    local()\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
    )
    read = subprocess.run([sys.executable, "-c", reader, str(tmp_path / "blob")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path.parent)
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == ["True True True __mp_main__"]
    assert frame(script, "local", "return 1 / 0") in read.stderr


@pytest.mark.subprocess
def test_a_function_defined_under_the_main_guard_travels_by_value_to_fresh_interpreters(tmp_path: Path) -> None:
    """A spawned rank imports the script without running its `if __name__ == "__main__":` block, so what that block
    defines is not there to be found by reference: it travels by value, and keeps its file and line."""
    script = tmp_path / "guarded.py"
    script.write_text(
        "import ddpw_runtime\n"
        "from ddpw_runtime import Platform, Wrapper\n"
        "\n"
        "if __name__ == '__main__':\n"
        "    def under_guard(x):\n"
        "        return (ddpw_runtime.rank(), x)\n"
        "\n"
        "    print(Wrapper(Platform(n_procs_per_node=2, spawn_method='spawn')).start(under_guard, 7))\n"
    )
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[(0, 7), (1, 7)]", proc.stdout
