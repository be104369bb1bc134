"""Lightning and Fabric find hydra-ddpw's callback factories through entry points (`pyproject.toml`),
which exist only where hydra-ddpw is installed; tests of a checkout that is not installed (or is
installed from another checkout) register them with a dist-info of their own."""

from __future__ import annotations

import os
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).parent.parent / "pyproject.toml"
_SECTION = re.compile(r'^\[project\.entry-points\."([^"]+)"\]\n((?:[^\[\n].*\n)+)', re.MULTILINE)


def library_entry_points() -> dict[str, str]:
    """The entry-point sections of `pyproject.toml` that name a callbacks factory, as `entry_points.txt`
    writes them, by group."""
    return {group: body.replace('"', "") for group, body in _SECTION.findall(PYPROJECT.read_text())
            if "callbacks_factory" in group}


def register_library_checks(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make the factories found in this process and in the programs it starts (`PYTHONPATH`), unless
    the installed metadata has them already."""
    groups = library_entry_points()
    if all(any(ep.name == "hydra_ddpw" for ep in entry_points(group=group)) for group in groups):
        return
    info = folder / "hydra_ddpw_library_checks-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hydra-ddpw-library-checks\nVersion: 0\n")
    (info / "entry_points.txt").write_text("".join(f"[{group}]\n{body}\n" for group, body in groups.items()))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
