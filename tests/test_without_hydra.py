"""A script that uses hydra-ddpw without Hydra (the Wrapper API, the helpers in a rank) never loads Hydra,
and the errors Hydra prints as one line are still printed so in a Hydra run (`ddpw_conf/errors.py`)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cloudpickle
import pytest
from hydra.errors import CompactHydraException

from ddpw_conf import ConfigError
from ddpw_runtime import _compat
from ddpw_runtime.errors import JobTimedOut, RankFailure, SlurmJobError

ROOT = Path(__file__).resolve().parents[1]

LOADED = """
import sys
def loaded():
    return sorted({name.split(".")[0] for name in sys.modules} & {"hydra", "omegaconf", "yaml", "antlr4"})
"""
"""`loaded()`: which of Hydra and what it brings this process has imported."""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", LOADED + code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    report: dict = json.loads(out.stdout.splitlines()[-1])
    return report


@pytest.mark.subprocess
def test_importing_the_runtime_and_its_public_names_loads_no_hydra() -> None:
    report = _run(
        "import json, torch\n"
        "import ddpw_runtime\n"
        "from ddpw_runtime import *\n"
        "from ddpw_runtime import ConfigError, JobTimedOut, Platform, RankFailure, SlurmJobError, Wrapper, rank\n"
        "print(json.dumps({'loaded': loaded(), 'names': len(ddpw_runtime.__all__)}))\n"
    )
    assert report["loaded"] == [] and report["names"] > 20


@pytest.mark.subprocess
def test_a_wrapper_job_loads_hydra_neither_in_the_caller_nor_in_its_ranks() -> None:
    report = _run(
        "import json, torch\n"
        "from ddpw_runtime import Platform, Wrapper\n"
        "ranks = Wrapper(Platform(n_procs_per_node=2)).start(loaded)\n"
        "in_caller = Wrapper(Platform(n_procs_per_node=2), caller_rank=True).start(loaded)\n"
        "print(json.dumps({'ranks': ranks, 'caller_rank': in_caller, 'caller': loaded()}))\n"
    )
    assert report == {"ranks": [[], []], "caller_rank": [[], []], "caller": []}


@pytest.mark.subprocess
def test_errors_become_compact_hydra_exceptions_once_hydra_is_loaded() -> None:
    report = _run(
        "import json\n"
        "from ddpw_runtime import ConfigError, RankFailure\n"
        "before = ConfigError('platform.n_nodes', 0, 'use an integer >= 1')\n"
        "plain = [c.__name__ for c in type(before).__mro__]\n"
        "from hydra.errors import CompactHydraException\n"
        "after = RankFailure(1, 0, 1, 'ValueError', 'bad')\n"
        "print(json.dumps({'plain': plain, 'loaded': loaded(), 'compact': isinstance(after, CompactHydraException),\n"
        "                  'was_compact': isinstance(before, CompactHydraException),\n"
        "                  'is_rank_failure': isinstance(after, RankFailure)}))\n"
    )
    assert "CompactHydraException" not in report["plain"] and report["was_compact"] is False
    assert report["loaded"] == ["antlr4", "hydra", "omegaconf", "yaml"]
    assert report["compact"] is True and report["is_rank_failure"] is True


ERRORS: dict[type[Exception], Callable[[], Exception]] = {
    ConfigError: lambda: ConfigError("platform.n_nodes", 0, "use an integer >= 1"),
    RankFailure: lambda: RankFailure(1, 0, 1, "ValueError", "bad batch", "Traceback...\nValueError: bad batch"),
    JobTimedOut: lambda: JobTimedOut(0.5, {0: "train (app.py:3)"}),
    SlurmJobError: lambda: SlurmJobError("SLURM job 7 was cancelled"),
}


@pytest.mark.parametrize("cls", ERRORS)
def test_hydra_prints_each_error_as_its_message_alone(cls: type[Exception], capsys: pytest.CaptureFixture[str]) -> None:
    error = ERRORS[cls]()

    def fail() -> None:
        raise error

    assert isinstance(error, CompactHydraException)
    with pytest.raises(SystemExit) as info:
        _compat.report_like_hydra(fail)  # Hydra's own report of a run's error
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(str(error) + "\n") and "Traceback (most recent call last)" not in err, err


@pytest.mark.parametrize("cls", ERRORS)
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_an_error_pickles_by_its_own_class_and_keeps_what_it_says(
    cls: type[Exception], dumps: Callable[..., bytes]
) -> None:
    error = ERRORS[cls]()
    error.note = "kept"  # type: ignore[attr-defined]
    again = pickle.loads(dumps(error))
    assert isinstance(again, cls) and type(again) is type(error) and str(again) == str(error)
    shown = (type(error).__module__, type(error).__qualname__)  # what a traceback names
    assert shown == (cls.__module__, cls.__qualname__)
    assert again.note == "kept"  # type: ignore[attr-defined]  # its attributes travel too
