"""docs/faults.md is checked against the tests it cites."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
FAULT_TESTS = ("test_faults.py", "test_supervision.py")


def _cited() -> set:
    return set(re.findall(r"`(test_\w+)`", (ROOT / "docs" / "faults.md").read_text()))


def _defined(files: tuple) -> set:
    names = set()
    for name in files:
        names |= set(re.findall(r"^def (test_\w+)", (ROOT / "tests" / name).read_text(), re.M))
    return names


def test_every_cited_test_exists() -> None:
    every_test = _defined(tuple(p.name for p in (ROOT / "tests").glob("test_*.py")))
    assert _cited() - every_test == set()


def test_every_fault_test_is_in_the_table() -> None:
    assert _defined(FAULT_TESTS) - _cited() == set()
