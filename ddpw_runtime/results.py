"""What a rank sends back, and the error a failed job raises in the caller."""

from __future__ import annotations

import pickle
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import cloudpickle

# Exceptions that ranks raise only because another rank went away first; never the root cause when a
# rank with any other failure exists.
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistStoreError",
    "DistNetworkError",
    "ProcessGroupGloo",
    "Socket Timeout",
)


@dataclass
class RankResult:
    """The outcome of one rank: its return value, or its exception as type, message and traceback."""

    rank: int
    ok: bool
    value: Any = None
    value_text: Optional[str] = None
    """repr() of a return value that could not be pickled (then `value` is None)."""
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    exception: Optional[bytes] = None
    """The exception itself, pickled, when that was possible."""
    finished_at: float = field(default_factory=time.time)

    @staticmethod
    def success(rank: int, value: Any) -> "RankResult":
        """A result carrying `value`, or its repr() when it cannot be pickled."""
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure turns the value into text
            return RankResult(rank, True, value_text=f"{value!r} (not picklable: {exc})")
        return RankResult(rank, True, value=value)

    @staticmethod
    def failure(rank: int, exc: BaseException) -> "RankResult":
        """A result describing `exc`; the exception object travels too when it survives pickling."""
        try:
            blob: Optional[bytes] = cloudpickle.dumps(exc)
            pickle.loads(blob)  # odd constructors fail here, not in the caller
        except Exception:  # noqa: BLE001 - fall back to the text form
            blob = None
        return RankResult(
            rank,
            False,
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            error_message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            exception=blob,
        )

    @property
    def is_secondary(self) -> bool:
        """Whether this failure looks like a consequence of another rank's failure."""
        text = f"{self.error_type} {self.error_message}"
        return any(marker in text for marker in _SECONDARY_MARKERS)

    def original_exception(self) -> Optional[BaseException]:
        """The rank's exception object, when it could be sent back."""
        if self.exception is None:
            return None
        try:
            return pickle.loads(self.exception)
        except Exception:  # noqa: BLE001 - a class missing here: keep the text form
            return None


class RankFailure(RuntimeError):
    """A distributed job failed; describes the rank that failed first (the root cause).

    `rank`, `node`, `exit_code`, `error_type`, `error_message`, `traceback_text` and `log_file` say
    what happened; `results` holds what every rank sent back (None for ranks that sent nothing), and
    `exit_codes` every rank's exit code by rank, where known (negative: killed by that signal).
    """

    def __init__(
        self,
        rank: int,
        node: int,
        exit_code: Optional[int],
        error_type: str,
        error_message: str,
        traceback_text: str,
        log_file: Optional[str],
        results: List[Optional[RankResult]],
        exit_codes: Optional[Dict[int, int]] = None,
    ) -> None:
        self.rank = rank
        self.node = node
        self.exit_code = exit_code
        self.error_type = error_type
        self.error_message = error_message
        self.traceback_text = traceback_text
        self.log_file = log_file
        self.results = results
        self.exit_codes = dict(exit_codes or {})
        super().__init__(self._describe())

    def _describe(self) -> str:
        head = f"rank {self.rank} (node {self.node}) failed: {self.error_type}"
        if self.error_message:
            head += f": {self.error_message}"
        parts = [head]
        if self.traceback_text:
            parts.append(f"\n--- traceback of rank {self.rank} ---\n{self.traceback_text.rstrip()}")
        if self.log_file:
            parts.append(f"\n(full output of rank {self.rank}: {self.log_file})")
        return "\n".join(parts)

    def __reduce__(self) -> Any:
        return (
            RankFailure,
            (self.rank, self.node, self.exit_code, self.error_type, self.error_message,
             self.traceback_text, self.log_file, self.results, self.exit_codes),
        )


class Terminated(SystemExit):
    """The controller received SIGTERM; its ranks were given the signal and stopped. Exits with 143
    when not caught, as a process killed by SIGTERM would."""

    def __init__(self) -> None:
        super().__init__(143)


class JobTimedOut(RuntimeError):
    """The job ran past `platform.timeout_min` and was stopped; `where` maps each rank to the
    place its stack dump shows it was (also in each rank's log)."""

    def __init__(self, timeout_min: int, where: Dict[int, str]) -> None:
        self.timeout_min = timeout_min
        self.where = where
        lines = [f"the job ran past its time limit (platform.timeout_min={timeout_min}) and was stopped; "
                 "where each rank was:"]
        lines += [f"  rank {rank}: {place}" for rank, place in sorted(where.items())]
        super().__init__("\n".join(lines))

    def __reduce__(self) -> Any:
        return (JobTimedOut, (self.timeout_min, self.where))
