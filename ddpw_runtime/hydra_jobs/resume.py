"""A sweep and its earlier run (`hydra.launcher.resume=true`, docs/sweeps.md): the sweep's summary, new or, on a
resume, the earlier run's once both are known to make the same jobs; then, launch by launch (a sweeper may launch in
batches), which jobs are kept (COMPLETED before: their JobReturn comes back, they do not run) and where the others ran
before (they run again in the same output dir).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig

from ddpw_conf import ConfigError
from ddpw_conf.launcher import LauncherOptions
from ddpw_runtime import _compat
from ddpw_runtime.hydra_jobs.prepare import JobToRun
from ddpw_runtime.hydra_jobs.summary import shown_path
from ddpw_runtime.hydra_jobs.sweep_summary import FILE_NAME, SweepRecord, SweepSummary, read_summary
from ddpw_runtime.launch.checks import check_not_under_torchrun

log = logging.getLogger(__name__)

LOCK_FILE = ".sweep_lock"
"""The file in a sweep dir that the process running a sweep in it holds (`_hold`)."""
_AGAIN = ("run the earlier command again with hydra.launcher.resume=true, or start a new sweep (another "
          "hydra.sweep.dir, without resume)")


def open_summary(config: DictConfig, options: LauncherOptions) -> SweepSummary:
    """The summary of the sweep whose master config is `config`: new, or with `options.resume` the earlier run's in
    the same sweep dir, once both are known to make the same jobs (else a `ConfigError` naming what differs)."""
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if options.runs_here:  # first: each copy of a program torchrun runs is told so (not that another holds the dir)
        check_not_under_torchrun(os.environ)
    _hold(sweep_dir)
    record = SweepRecord.of(config)
    if not options.resume:
        if not options.dry_run and (ran := read_summary(sweep_dir)) is not None \
                and record.sweeper == _compat.BASIC_SWEEPER \
                and not _differences(ran[0], record) \
                and (done := sum(e.status == JobStatus.COMPLETED.name for e in ran[1])):
            log.warning(f"hydra.sweep.dir={sweep_dir} holds an earlier run of this sweep, {done} of its jobs "
                        "COMPLETED: this sweep runs them again, in the same dirs; to keep them, stop it (Ctrl-C) "
                        "and run it with hydra.launcher.resume=true")
        return SweepSummary(sweep_dir, record)
    if record.sweeper != _compat.BASIC_SWEEPER:
        raise ConfigError("hydra.launcher.resume", True, "resume works with Hydra's basic sweeper, whose jobs follow "
                          f"from the overrides; {record.sweeper} chooses its jobs as it goes, from the results so far, "
                          "so this run's jobs cannot be matched to an earlier run's; a sweeper with storage of its own "
                          "resumes from there (Optuna: the same hydra.sweeper.storage and hydra.sweeper.study_name, "
                          "in a new hydra.sweep.dir, without resume)")
    if (earlier := read_summary(sweep_dir)) is None:
        found = shlex.quote(beside) if (beside := _newest_run_beside(sweep_dir, record)) else None
        raise ConfigError("hydra.launcher.resume", True, f"hydra.sweep.dir={sweep_dir} holds no earlier run of a "
                          f"sweep (no {sweep_dir / 'sweep_summary.json'} with its record): " + (
                              f"the newest earlier run of this sweep is in {found}: add hydra.sweep.dir={found} to go "
                              "on with it" if found else "give the sweep dir of the run to go on with (its summary "
                              "and its jobs' output dirs name it)") + ", or run without resume")
    if differences := _differences(earlier[0], record):
        raise ConfigError("hydra.launcher.resume", True, "this sweep differs from the earlier run in "
                          f"hydra.sweep.dir={sweep_dir}: {'; '.join(differences)}; " + _AGAIN)
    # A job's output dir inside the sweep dir as it was is at the same place inside it now (copied or moved since).
    before, now = Path(earlier[0].sweep_dir or record.sweep_dir), Path(record.sweep_dir)
    return SweepSummary(sweep_dir, record, [replace(e, output_dir=str(now / Path(e.output_dir).relative_to(before)))
                                            if Path(e.output_dir).is_relative_to(before) else e for e in earlier[1]])


def _newest_run_beside(sweep_dir: Path, record: SweepRecord) -> str | None:
    """The newest sweep dir beside `sweep_dir` whose summary is of the same sweep as `record`, as the console shows
    it; beside: in the same folder or one level up (Hydra's default `multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}` is a
    new dir at each start, so a resume that names no sweep dir looks for its earlier run in a new one)."""
    here = sweep_dir.absolute()
    found: dict[Path, float] = {}
    for root, pattern in ((here.parent, f"*/{FILE_NAME}"), (here.parent.parent, f"*/*/{FILE_NAME}")):
        for path in root.glob(pattern) if root.is_dir() else ():
            summary = read_summary(path.parent)
            if path.parent != here and summary is not None and not _differences(summary[0], record):
                found[path.parent] = path.stat().st_mtime
    return shown_path(max(found, key=found.__getitem__), Path.cwd()) if found else None


_HELD: dict[Path, int] = {}
"""The lock file of each sweep dir this process holds, open as long as it lives (`_hold`)."""
_MADE: dict[Path, list[Path]] = {}
"""For each lock file of `_HELD`, the dirs `_hold` made for it (its sweep dir and the parents that lacked), deepest
first."""


def _hold(sweep_dir: Path) -> None:
    """Hold `sweep_dir` for this process's sweeps, else `ConfigError` naming its holder: two sweeps in it at once would
    run the same jobs in the same dirs. A POSIX record lock on `LOCK_FILE`: the kernel drops it when the process ends,
    however it ends (SIGKILL too), and a fork does not inherit it; a file system without locks holds nothing."""
    path = (sweep_dir / LOCK_FILE).absolute()
    if path in _HELD:  # (a program that runs several sweeps in the same dir, one after another)
        return
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:  # (a dir this user cannot write to: the sweep itself says so, as it writes there)
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.read(fd, 20).decode(errors="replace").strip() or "?"
        os.close(fd)
        if error.errno not in (errno.EACCES, errno.EAGAIN):
            return
        raise ConfigError("hydra.sweep.dir", str(sweep_dir), f"a sweep runs in this dir now (process {holder}), and "
                          "two would run the same jobs in the same dirs at once: wait for it to end (or stop it), "
                          "then resume it with hydra.launcher.resume=true; or give this sweep another "
                          "hydra.sweep.dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[path] = fd
    _MADE[path] = made


@contextmanager
def refusing(sweep_dir: Path) -> Iterator[None]:
    """A `ConfigError` raised in the block refuses the sweep in `sweep_dir` before any of its jobs started
    (`let_go_unused`)."""
    try:
        yield
    except ConfigError:
        let_go_unused(sweep_dir)
        raise


def let_go_unused(sweep_dir: Path) -> None:
    """Undo `_hold` for a sweep refused before any job started, where `_hold` made its dir: the lock and Hydra's
    `multirun.yaml` go, then each dir `_hold` made that is left empty, so a refused sweep leaves no dir behind. A dir
    that holds anything else (written by a callback of the app's) is left as it is."""
    path = (sweep_dir / LOCK_FILE).absolute()
    made = _MADE.pop(path, [])
    if path.parent not in made or not set(os.listdir(path.parent)) <= {LOCK_FILE, "multirun.yaml"}:
        return
    os.close(_HELD.pop(path))
    for name in (LOCK_FILE, "multirun.yaml"):
        (path.parent / name).unlink(missing_ok=True)
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # (not empty: another sweep's date dir, say)
            return


def _differences(earlier: SweepRecord, now: SweepRecord) -> list[str]:
    """What differs between two sweeps' records, in the user's words."""
    before, after = _by_key(earlier.overrides), _by_key(now.overrides)
    found = [f"{after.get(key, f'no {key}')} (earlier: {before.get(key, f'no {key}')})"
             for key in dict.fromkeys([*before, *after]) if before.get(key) != after.get(key)]
    if earlier.sweeper != now.sweeper:
        found.append(f"hydra/sweeper {now.sweeper} (earlier: {earlier.sweeper})")
    if earlier.params != now.params:
        found.append(f"hydra.sweeper.params {now.params} (earlier: {earlier.params})")
    if earlier.config_name and earlier.config_name != now.config_name:
        found.append(f"--config-name {now.config_name} (earlier: {earlier.config_name})")
    return found


def _by_key(overrides: Sequence[str]) -> dict[str, str]:
    """Overrides by the key they set (`+lr=0.1` and `lr=0.1` set the same key)."""
    return {override.split("=", 1)[0].lstrip("+~"): override for override in overrides}


@dataclass
class Launch:
    """One launch of a sweep: the jobs kept from the earlier run and those that run now."""

    numbers: list[int]
    """Every job of the launch, in order."""
    kept: dict[int, JobReturn] = field(default_factory=dict)
    to_run: list[JobToRun] = field(default_factory=list)

    def returns(self, run: Sequence[JobReturn]) -> list[JobReturn]:
        """Every job's JobReturn, in job order: the kept ones and `run`, those of `to_run` in its order."""
        ran = dict(zip((job.idx for job in self.to_run), run, strict=True))
        return [self.kept[idx] if idx in self.kept else ran[idx] for idx in self.numbers]


def plan_launch(summary: SweepSummary, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
                dry_run: bool = False) -> Launch:
    """Which jobs of a launch are kept and which run. A job whose overrides differ from the earlier run's job of that
    number refuses the launch (`ConfigError`) before any starts; each kept job gets its entry (not in a dry run) and
    a line in the log."""
    launch = Launch(list(range(initial_job_idx, initial_job_idx + len(job_overrides))))
    for idx, overrides in zip(launch.numbers, job_overrides, strict=True):
        if (before := summary.entries.get(idx)) is None:
            launch.to_run.append(JobToRun(idx, list(overrides)))
            continue
        if _by_key(before.overrides) != _by_key(overrides):  # (the same overrides typed in another order match)
            raise ConfigError("hydra.launcher.resume", True, (
                f"job #{idx} of this sweep is '{' '.join(overrides)}', the earlier run's job #{idx} was "
                f"'{' '.join(before.overrides)}' (swept keys typed in another order, or other config files, give the "
                "jobs in another order); " + _AGAIN))
        ret = summary.kept_return(idx) if before.status == JobStatus.COMPLETED.name else None
        if ret is None:
            if before.status == JobStatus.COMPLETED.name:
                log.warning(f"job #{idx} COMPLETED in the earlier run, but its JobReturn cannot be read: it runs again")
            launch.to_run.append(JobToRun(idx, list(overrides), Path(before.output_dir)))
            continue
        launch.kept[idx] = ret
        log.info(f"#{idx} : {' '.join(filter_overrides(overrides))} (kept: COMPLETED in the earlier run)")
        if not dry_run:
            summary.record(replace(before, kept=True))
    return launch
