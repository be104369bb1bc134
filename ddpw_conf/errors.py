"""The error raised for a configuration that cannot run."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from hydra.errors import CompactHydraException


class ConfigError(ValueError, CompactHydraException):
    """A configuration value that cannot run, found before any process starts.

    The message always names the key, the value that was given and what to do instead. Hydra prints
    it as one line, without a traceback (it is a CompactHydraException).
    """

    def __init__(self, key: str, value: Any, fix: str) -> None:
        self.key = key
        self.value = value
        self.fix = fix
        super().__init__(f"{key}={value!r}: {fix}")

    def __reduce__(self) -> tuple:
        return (ConfigError, (self.key, self.value, self.fix))


def unknown_key(key: str, value: Any, known: Iterable[str], owner: str, noun: str = "field") -> ConfigError:
    """The error for `key` (its full dotted name), which `owner` does not have: the nearest of the
    `known` names first (a typo, a part of the name, or the name with more to it), then all of them."""
    names = sorted(known)
    word = key.rpartition(".")[2]
    nearest = difflib.get_close_matches(word, names, n=1) or [
        name for name in names if word.lower() in name or name in word.lower()
    ]
    guess = f"did you mean {' or '.join(nearest)}? " if 0 < len(nearest) <= 2 else ""
    return ConfigError(key, value, f"{owner} has no such {noun}; {guess}its {noun}s are {', '.join(names)}")
