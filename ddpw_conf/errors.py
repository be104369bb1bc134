"""The error raised for a configuration that cannot run."""

from __future__ import annotations

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
