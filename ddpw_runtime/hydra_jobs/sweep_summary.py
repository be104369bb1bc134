"""What a multirun did, job by job: `sweep_summary.json` in the sweep dir, rewritten as each job starts and ends (an
interrupted sweep keeps what it did; a resume reads it), each COMPLETED job's JobReturn kept beside it
(`.job_returns/<job>.pkl`), and a table of it on the console when the sweep ends.

    [ddpw] sweep summary: 3 jobs, 2 COMPLETED, 1 FAILED (multirun/2026-11-23/10-00-00/sweep_summary.json)
      job  status               time   rank 0 returned  output dir  overrides
      #0   COMPLETED            3.1 s  0.9583           0           lr=0.1
      #1   FAILED (2 restarts)  1.2 s  ValueError: ...  1           lr=0.01
      same in every job: epochs=10 platform.n_procs_per_node=2

The table shows the overrides that differ between jobs (those of every job once, below it) and numbers to 4
significant digits; the JSON keeps every job's overrides and the values as they are.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import shlex
import sys
import threading
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ddpw_runtime import _compat
from ddpw_runtime.hydra_jobs.prepare import as_typed
from ddpw_runtime.hydra_jobs.summary import PREFIX, counted, one_line, shown_path
from ddpw_runtime.hydra_jobs.task import DdpwJobReturn
from ddpw_runtime.launch import pickling
from ddpw_runtime.launch.console import show
from ddpw_runtime.launch.payload import read_pickled, write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "sweep_summary.json"
RETURNS = ".job_returns"
"""The sweep dir's folder of COMPLETED jobs' JobReturns (`<job>.pkl`, pickled as the job ended)."""
_SHOWN_VALUE_CHARS = 40
_DIGITS = 4
"""Significant digits of a float in the table."""


@dataclass
class JobEntry:
    """One job of a sweep, as the summary gives it."""

    job: int
    overrides: list[str]
    status: str
    """COMPLETED, FAILED, INTERRUPTED / TERMINATED (Ctrl-C / SIGTERM), STOPPED (by another job's failure,
    `fail_fast`), NOT STARTED; while a job runs, RUNNING (on SLURM: SUBMITTED), left behind if the sweep is killed."""
    duration_s: float
    return_value: Any
    """Rank 0's return value: as it is when JSON can hold it, else its `repr()`; None when it failed."""
    output_dir: str
    error: str | None = None
    """Why it failed, in one line."""
    kept: bool = False
    """Kept from an earlier run of the sweep (`hydra.launcher.resume=true`): not run again."""
    restarts: int = 0
    """How often it started again before it ended (`hydra.launcher.max_restarts`; on SLURM, requeued)."""


@dataclass
class SweepRecord:
    """What makes a sweep's jobs, kept in the summary: a resume must have the same."""

    overrides: list[str]
    """The command line's overrides of the task config (`hydra.overrides.task`), sweeps as typed."""
    sweeper: str
    """The sweeper's class (`hydra.sweeper._target_`)."""
    params: Any = None
    """The sweeps the config gives the sweeper (`hydra.sweeper.params`), unresolved."""
    config_name: str = ""
    """The primary config's name (`--config-name`; "None" without one; "" in a summary from before it was kept)."""
    sweep_dir: str = ""
    """Where the sweep ran (absolute): a resume of a sweep dir moved since runs its jobs in their dirs there."""

    @staticmethod
    def of(config: DictConfig) -> SweepRecord:
        """The record of the sweep whose (master) config is `config`."""
        params = OmegaConf.select(config, "hydra.sweeper.params")
        return SweepRecord(list(as_typed(config.hydra.overrides.task)),
                           str(OmegaConf.select(config, "hydra.sweeper._target_")),
                           OmegaConf.to_container(params) if OmegaConf.is_config(params) else params,
                           str(OmegaConf.select(config, "hydra.job.config_name")),
                           str(Path(str(config.hydra.sweep.dir)).absolute()))


def entry(job: int, overrides: list[str], output_dir: Path, duration_s: float, ret: JobReturn | None,
          stopped_by: str | None = None) -> JobEntry:
    """The entry of a job that ended with `ret` (None: stopped or never started, as `stopped_by` says)."""
    if ret is None or stopped_by is not None:
        return JobEntry(job, overrides, stopped_by or "INTERRUPTED", round(duration_s, 3), None, str(output_dir))
    failed = ret.status is not JobStatus.COMPLETED
    value = None if failed else _as_json(ret.return_value)
    cause = _compat.job_error(ret)
    error = (one_line(cause) if isinstance(cause, BaseException) else repr(cause)) if failed else None
    restarts = ret.restarts if isinstance(ret, DdpwJobReturn) else 0
    return JobEntry(job, overrides, ret.status.name, round(duration_s, 3), value, str(output_dir), error,
                    restarts=restarts)


def _as_json(value: Any) -> Any:
    """`value` if JSON can hold it (a non-finite float too: see `_finite`), else its `repr()`."""
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        try:
            return repr(value)
        except Exception as error:  # noqa: BLE001 - a repr that works only in a rank (it asks for the rank's state)
            return f"<{type(value).__qualname__}: its repr() failed here: {type(error).__name__}: {error}>"
    return value


def _finite(value: Any) -> Any:
    """`value` with each nan or infinite float, nested ones too, as a string ("nan", "inf"): JSON any reader takes."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(float(value))
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class SweepSummary:
    """The entries of one sweep's jobs, kept in `sweep_dir / FILE_NAME` with the sweep's record (callable from any
    thread); `earlier`: the entries a resumed sweep starts from, each kept until its job's new one."""

    written_here: ClassVar[set[Path]] = set()
    """The summaries this process wrote (an earlier run's, left as it was, is not shown as this run's)."""

    def __init__(self, sweep_dir: Path, sweep: SweepRecord, earlier: list[JobEntry] | None = None) -> None:
        self.path = (Path(sweep_dir) / FILE_NAME).absolute()
        self.sweep = sweep
        self.entries: dict[int, JobEntry] = {e.job: e for e in earlier or []}
        self._lock = threading.Lock()

    def record(self, job_entry: JobEntry, ret: JobReturn | None = None) -> None:
        """Add (or replace) a job's entry and rewrite the file, atomically; keep `ret` first if it COMPLETED."""
        if ret is not None and job_entry.status == JobStatus.COMPLETED.name and not job_entry.kept:
            self._keep(job_entry.job, ret)
        with self._lock:
            self.entries[job_entry.job] = job_entry
            data = {"sweep": asdict(self.sweep), "jobs": [asdict(self.entries[job]) for job in sorted(self.entries)]}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(_finite(data), indent=1, default=repr, allow_nan=False)
            write_atomically(self.path, (text + "\n").encode(), 0o644)
            self.written_here.add(self.path)

    def _keep(self, job: int, ret: JobReturn) -> None:
        path = self.path.parent / RETURNS / f"{job}.pkl"
        try:
            data = pickling.dumps(ret)
        except Exception as error:  # noqa: BLE001 - the sweep goes on; only a resume cannot keep this job
            log.warning(f"job #{job}'s JobReturn cannot be pickled ({type(error).__name__}: {error}): a resume "
                        "runs it again")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data, 0o644)

    def kept_return(self, job: int) -> JobReturn | None:
        """The JobReturn kept when job `job` COMPLETED, or None where there is none that can be read."""
        return read_pickled(self.path.parent / RETURNS / f"{job}.pkl", JobReturn)


def read_summary(sweep_dir: Path) -> tuple[SweepRecord, list[JobEntry]] | None:
    """The record and job entries of the summary in `sweep_dir`, or None where there is none with a record."""
    try:
        data = json.loads((Path(sweep_dir) / FILE_NAME).read_text())
        known = {f.name for f in fields(JobEntry)}
        return (SweepRecord(**data["sweep"]),
                [JobEntry(**{key: value for key, value in e.items() if key in known}) for e in data["jobs"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fail_fast_line(failed: int, stopped: list[int], not_started: list[int]) -> str:
    """The line that says job #`failed` stops the sweep (`fail_fast`): the jobs it stops and those never started."""
    numbers = [", ".join(f"#{idx}" for idx in idxs) for idxs in (stopped, not_started)]
    return (f"{PREFIX} job #{failed} failed (hydra.launcher.fail_fast=true): "
            + (f"stopping job(s) {numbers[0]}; " if stopped else "")
            + (f"not starting job(s) {numbers[1]}" if not_started else "no job left to start"))


def table(entries: list[dict[str, Any]], path: Path, base: Path) -> str:
    """The summary as the console shows it."""
    counts = Counter(str(e["status"]) for e in entries)
    kept = sum(1 for e in entries if e.get("kept"))
    tally = ", ".join(f"{count} {status}" + (f" ({kept} kept)" if kept and status == "COMPLETED" else "")
                      for status, count in counts.items())  # (only a COMPLETED job is kept)
    overrides = [filter_overrides(e["overrides"]) for e in entries]
    # The overrides every job has, in the first job's order: shown once, below the table.
    rest = [set(own) for own in overrides[1:]]
    common = [o for o in overrides[0] if all(o in own for own in rest)] if len(entries) > 1 else []
    rows = [["job", "status", "time", "rank 0 returned", "output dir", "overrides"]]
    for e, own in zip(entries, overrides, strict=True):
        value = e["return_value"]
        shown = e["error"] if e["error"] is not None else ("" if value is None else _shown(value))
        if len(shown) > _SHOWN_VALUE_CHARS:
            shown = shown[:_SHOWN_VALUE_CHARS - 3] + "..."
        notes = [counted(e["restarts"], "restart")] if e.get("restarts") else []
        notes += ["kept"] if e.get("kept") else []
        status = str(e["status"]) + (f" ({', '.join(notes)})" if notes else "")
        time = "-" if e["status"] == "NOT STARTED" else f"{e['duration_s']:.1f} s"
        rows.append([f"#{e['job']}", status, time, shown,
                     shown_path(Path(e["output_dir"]), base), " ".join(o for o in own if o not in common)])
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
    lines = [f"{PREFIX} sweep summary: {counted(len(entries), 'job')}, {tally} ({shown_path(path, base)})"]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  " + "  ".join([*cells, row[-1]]))
    if common:
        lines.append(f"  same in every job: {' '.join(common)}")
    return "\n".join(line.rstrip() for line in lines)


def _shown(value: Any) -> str:
    """A return value as the table shows it: floats, nested ones too, to `_DIGITS` digits (`2.0`, not `2`)."""
    if isinstance(value, float):
        text = format(value, f".{_DIGITS}g")
        return text + ".0" if text.lstrip("-").isdigit() else text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return str(value)


class PrintSweepSummary(Callback):
    """Hydra callback (brought by `hydra/launcher=ddpw_*`): prints the sweep summary when a multirun ends; when it
    ends by a failed job (Hydra's sweepers raise its error), Ctrl-C or SIGTERM, as the program exits."""

    path: Path | None = None
    """Where the summary is, until it is printed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Note where the summary will be, and print it at exit should the multirun not end normally."""
        self.path = (Path(str(config.hydra.sweep.dir)) / FILE_NAME).absolute()
        atexit.register(self.print_summary)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Print the summary."""
        self.print_summary()

    def print_summary(self) -> None:
        """Print the table of `sweep_summary.json` (once), when the launcher wrote one in this run."""
        path, self.path = self.path, None
        if path is None:
            return
        atexit.unregister(self.print_summary)
        if path not in SweepSummary.written_here:
            return
        try:
            data = json.loads(path.read_text())
            entries, sweeper = data["jobs"], data["sweep"]["sweeper"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        text = table(entries, path, Path.cwd())
        if sweeper == _compat.BASIC_SWEEPER and any(e["status"] != JobStatus.COMPLETED.name for e in entries):
            text += ("\n  resume: the same command with hydra.launcher.resume=true hydra.sweep.dir="
                     f"{shlex.quote(shown_path(path.parent, Path.cwd()))} runs the jobs not COMPLETED (in their dirs) "
                     "and keeps the others")
        show(text, sys.stdout)  # (`| tee` may have ended by the same Ctrl-C)
