"""What a rank sends back to its controller: `RankResult`, with its value or its exception as a `RaisedError`; what
cannot be rebuilt in another process travels as text (`portable_pickle` decides). Data only (no torch)."""

from __future__ import annotations

import pickle
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ddpw_runtime.launch import pickling

SECONDARY_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "DistStoreError",
                     "DistNetworkError", "ProcessGroupGloo", "Socket Timeout")
"""Words of failures ranks see only because another rank went away first (gloo's lost connections, store timeouts):
never the root cause while another failure exists."""

COLLECTIVE_TIMEOUT_MARKERS = ("Timed out waiting", "Watchdog caught collective operation timeout")
"""Words of a collective's timeout: gloo's (the rank raises), NCCL's watchdog (in the log of the rank it aborts)."""

_TEXT_LIMIT = 20_000  # longest `repr()` text kept for a value that cannot travel


def portable_pickle(obj: Any) -> bytes | None:
    """`obj` pickled (`pickling.dumps`), or None when it cannot be, or not loaded again (odd constructors fail then)."""
    try:
        blob = pickling.dumps(obj)
        pickle.loads(blob)
    except Exception:  # any failure to pickle or to load again means: send text instead
        return None
    return blob


def portable(exc: BaseException, as_text: type[Exception] = RuntimeError) -> BaseException:
    """`exc` if it survives the trip to another process, else an `as_text` error with its type, message, traceback."""
    if portable_pickle(exc) is not None:
        return exc
    text = traceback_text(exc).rstrip()
    return as_text(f"{qualified_name(type(exc))}: {message_of(exc)}\n{text}")


def message_of(exc: BaseException) -> str:
    """`str(exc)`; when that raises (a broken `__str__`), a text that says why the message could not be read."""
    try:
        return str(exc)
    except Exception as failure:  # any error of the exception's own __str__
        why = traceback.format_exception_only(failure)[-1].strip()  # safe: Python's own fallback for a bad str
        return f"<its message could not be read: str() raised {why}>"


_IMPORTED_SCRIPT = "__mp_main__."  # a class of the user's script where another process imported it (pickling.py)


def qualified_name(cls: type) -> str:
    """`module.QualName` of `cls`, without `builtins.`; a class of the user's script is `__main__.QualName` in every
    process, as in the script's own."""
    name = f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins.")
    return f"__main__.{name.removeprefix(_IMPORTED_SCRIPT)}" if name.startswith(_IMPORTED_SCRIPT) else name


def traceback_text(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it in the script's own process, also where the script was imported (as
    `__mp_main__`): a class of the script is named without a module."""
    return "".join(part.removeprefix(_IMPORTED_SCRIPT) for part in traceback.format_exception(exc))


@dataclass
class RaisedError:
    """An exception as type, message and traceback text, plus the exception itself pickled when it survives the trip."""

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None = None

    @staticmethod
    def of(exc: BaseException) -> RaisedError:
        """The record of `exc`."""
        return RaisedError(type_name=qualified_name(type(exc)), message=message_of(exc),
                           traceback=traceback_text(exc), pickled=portable_pickle(exc))

    @property
    def headline(self) -> str:
        """`Type: message` (or just `Type`)."""
        return f"{self.type_name}: {self.message}" if self.message else self.type_name

    @property
    def is_secondary(self) -> bool:
        """Whether this failure looks like a consequence of another rank's failure."""
        text = f"{self.type_name} {self.message}"
        return any(marker in text for marker in SECONDARY_MARKERS)

    @property
    def is_collective_timeout(self) -> bool:
        """Whether this is a collective's timeout: the rank waited for others that did not come."""
        return any(marker in self.message for marker in COLLECTIVE_TIMEOUT_MARKERS)

    def exception(self) -> BaseException | None:
        """The exception object, when it could be sent and can be rebuilt here."""
        try:
            return None if self.pickled is None else pickle.loads(self.pickled)
        except Exception:  # a class missing here: keep the text form
            return None


@dataclass
class RankResult:
    """What one rank sent back: its return value (pickled), or the error it ended with."""

    rank: int
    error: RaisedError | None = None
    value_pickle: bytes | None = None
    value_text: str | None = None  # repr() of a value not pickled, or whose class the launcher may not import
    value_type: str = ""  # the qualified name of the return value's class
    imported: tuple[str, ...] = ()
    """Torch modules this rank imported that its parent lacked: the starter loads them for later jobs (`Preload`)."""
    finished_at: float = field(default_factory=time.time)
    exited: str = ""
    """How a task that did not return ended its rank with success: `called sys.exit(0)` (its own words for the exit, as
    they follow "its task" or "it"); "" when it returned."""

    @property
    def ok(self) -> bool:
        """Whether the task returned (or ended its rank with success: `exited`)."""
        return self.error is None

    @staticmethod
    def success(rank: int, value: Any, loaded_by_task: Collection[str] = ()) -> RankResult:
        """A result carrying `value`, or its repr() when it cannot be pickled; its repr() too when its class comes from
        a module in `loaded_by_task` (the launching process may not import it, and then shows that)."""
        kind = qualified_name(type(value))
        try:  # not `portable_pickle`: loading a large value again here would double its cost
            blob = pickling.dumps(value)
        except Exception as exc:  # any pickling failure turns the value into text
            return RankResult(rank, value_text=f"{_bounded_repr(value)} (not picklable: {exc})", value_type=kind)
        text = _bounded_repr(value) if type(value).__module__ in loaded_by_task else None
        return RankResult(rank, value_pickle=blob, value_text=text, value_type=kind)

    @staticmethod
    def failure(rank: int, exc: BaseException) -> RankResult:
        """A result describing `exc`."""
        return RankResult(rank, error=RaisedError.of(exc))

    def value(self) -> Any:
        """The rank's return value; its repr() text when it could not travel or cannot be rebuilt here."""
        if self.value_pickle is None:
            return self.value_text
        try:
            return pickle.loads(self.value_pickle)
        except Exception as exc:  # the value's class does not exist here
            if self.value_text is not None:
                return f"{self.value_text} (cannot be rebuilt in the launching process: {exc})"
            return f"<{self.value_type} value that cannot be rebuilt in the launching process: {exc}>"


def _bounded_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ still gives a result
        text = f"<{qualified_name(type(value))} object; repr() failed: {exc}>"
    return text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "...(cut)"
