"""`ConfigError`, and `CompactError`: the base of every hydra-ddpw error whose message says it all.

Hydra prints only the message of a `hydra.errors.CompactHydraException`, but importing it imports all of Hydra,
which a script that only uses `Wrapper` should not pay for. So where Hydra is loaded, `CompactError(...)` gives an
instance of a subclass that also derives from `CompactHydraException` (made once per class, same name, module and
docstring), as `OSError(errno, ...)` gives a `FileNotFoundError`; elsewhere the class itself. `except` and
`isinstance` behave the same either way, and a pickled error is made again as what the receiving process can report.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

_E = TypeVar("_E", bound="CompactError")
_REPORTED_BY_HYDRA: dict[type, type] = {}
"""Each error class's subclass that Hydra prints as one line, made the first time it is needed."""


class CompactError(Exception):
    """An error whose message holds everything worth showing: Hydra prints it as one line, without a traceback."""

    def __new__(cls: type[_E], *args: Any, **kwargs: Any) -> _E:
        hydra_errors = sys.modules.get("hydra.errors")
        if hydra_errors is not None and not issubclass(cls, compact := hydra_errors.CompactHydraException):
            if (made := _REPORTED_BY_HYDRA.get(cls)) is None:
                namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                             "made_as": cls}
                made = _REPORTED_BY_HYDRA.setdefault(cls, type(cls.__name__, (cls, compact), namespace))
            cls = made
        return super().__new__(cls, *args, **kwargs)

    def __reduce__(self) -> Any:
        # Made again without a constructor call (so every subclass pickles, whatever its arguments), as the class
        # whose constructor made the error, not Hydra's subclass of it.
        return (_remade, (type(self).__dict__.get("made_as", type(self)), self.args, self.__dict__))


def _remade(cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]) -> _E:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(CompactError, ValueError):
    """A config value that cannot run, found before any process starts: names the key, the value and the fix."""

    def __init__(self, key: str, value: Any, fix: str) -> None:
        self.key, self.value, self.fix = key, value, fix
        super().__init__(f"{key}={value!r}: {fix}")


def check_known(prefix: str, node: Mapping[str, Any], known: Collection[str], owner: str, noun: str = "field",
                not_ours: str = "", renamed: Mapping[str, str] | None = None) -> None:
    """Raise `ConfigError` for the first key of `node` not in `known` (`prefix` + key is its full name): the nearest
    known name (the one `renamed` gives it, if any), then all of them (but `_target_`), then `not_ours`."""
    for key in node:
        if key not in known:
            full = f"{prefix}{key}"
            names = sorted(set(known) - {"_target_"})
            last = full.rpartition(".")[2]
            guess = f"did you mean {renamed[last]}? " if renamed and last in renamed else nearest_guess(last, names)
            raise ConfigError(full, node[key],
                              f"{owner} has no such {noun}; {guess}its {noun}s are {', '.join(names)}{not_ours}")


def nearest_guess(word: str, names: Sequence[str]) -> str:
    """`did you mean ...? ` naming the nearest of `names` to `word` (a typo, a part, or more), or "" if none or many.
    A part starts where a word of the other does (`procs` of `n_procs_per_node`, `qos` of `qos_name`): a word found
    inside another (`ram` in `slurm_additional_parameters`) is no guess."""
    nearest = (difflib.get_close_matches(word, names, n=1)
               or [name for name in names if _starts_a_word_of(word, name) or _starts_a_word_of(name, word)])
    return f"did you mean {' or '.join(nearest)}? " if 0 < len(nearest) <= 2 else ""


def _starts_a_word_of(part: str, name: str) -> bool:
    """Whether `part` is in `name` where one of its words (split at `_` and `.`) starts, case aside."""
    return re.sub(r"[._]", "_", f"_{name}").lower().find(re.sub(r"[._]", "_", f"_{part}").lower()) >= 0


def is_int(value: Any) -> bool:
    """Whether `value` is an integer (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(key: str, value: Any, minimum: int, alternative: str = "", optional: bool = False) -> None:
    """Raise `ConfigError` unless `value` is an integer >= `minimum` (or None, if `optional`)."""
    if not (optional and value is None) and (not is_int(value) or value < minimum):
        raise ConfigError(key, value, f"use an integer >= {minimum}{alternative}{number_as_text(value)}")


def check_bool(key: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is true or false."""
    if not isinstance(value, bool):
        raise ConfigError(key, value, "use true or false")


def check_number(key: str, value: Any, fix: str, positive: bool = False) -> None:
    """Raise `ConfigError` (with `fix`) unless `value` is a number (not a bool) >= 0, or > 0 if `positive` (not NaN)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 or (positive and not value > 0):
        raise ConfigError(key, value, fix + number_as_text(value))


def number_as_text(value: Any) -> str:
    """A fix's addition for a number that came as text (quoted, or read with `${oc.env:...}`); else ""."""
    try:
        float(value if isinstance(value, str) else "-")
    except ValueError:
        return ""
    return (f"; this is a string, not a number: write it unquoted ({value.strip()}, not {value!r}), or decode a "
            "variable's value with oc.decode, such as ${oc.decode:${oc.env:MYCPUS}}")


def check_choice(key: str, value: Any, choices: Sequence[str], alternative: str = "") -> None:
    """Raise `ConfigError` unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(key, value, f"choose one of {', '.join(choices)}{alternative}")


def check_match(key: str, value: Any, pattern: re.Pattern[str], fix: str, optional: bool = False) -> None:
    """Raise `ConfigError` (with `fix`) unless `value` is a string `pattern` matches whole (or None, if `optional`).
    Whole: `match` with `$` also accepts a trailing newline, which would add a line to an sbatch script."""
    if not (optional and value is None) and (not isinstance(value, str) or not pattern.fullmatch(value)):
        raise ConfigError(key, value, fix)
