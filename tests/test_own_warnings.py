"""hydra-ddpw's own code warns of nothing, on the omegaconf and hydra-core this runs with (CI runs this
file against the newest releases too): a plain run, a sweep with `${now:}` and the own-platform launcher
option, with every warning shown (`PYTHONWARNINGS=default`), in the console and in every rank's log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run_app

pytestmark = pytest.mark.subprocess

OWN_CODE = re.compile(r"(ddpw_conf|ddpw_runtime|hydra_ddpw_launcher)/[\w/]+\.py:\d+: \w*Warning.*")


def warnings_of_own_code(proc_output: str, root: Path) -> list[str]:
    """Every warning the console or a rank's log attributes to a file of hydra-ddpw."""
    texts = [proc_output, *(log.read_text() for log in root.rglob("rank_*.log"))]
    return [found.group(0) for text in texts for found in OWN_CODE.finditer(text.replace("\\", "/"))]


@pytest.mark.parametrize("args", [
    ("hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"),
    ("-m", "hydra/launcher=ddpw_cpu_own_platform", "ddpw_platform.n_procs_per_node=1,2"),
])
def test_no_warning_comes_from_hydra_ddpws_own_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    args: tuple[str, ...]) -> None:
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    proc = run_app(tmp_path, *args, app="stamped_app.py")
    assert proc.returncode == 0, proc.stderr
    assert warnings_of_own_code(proc.stdout + proc.stderr, tmp_path) == []
    # What hydra-ddpw opens, it closes: rank 0's channel to its supervisor in a plain run was left open, and Python's
    # warning, as the program ended, named a line of Hydra's (or `sys:1`).
    assert unclosed(proc.stdout + proc.stderr, tmp_path) == []


def unclosed(proc_output: str, root: Path) -> list[str]:
    """Every warning of something left unclosed, in the console or a rank's log."""
    texts = [proc_output, *(log.read_text() for log in root.rglob("rank_*.log"))]
    return [line for text in texts for line in text.splitlines() if "ResourceWarning: unclosed" in line]
