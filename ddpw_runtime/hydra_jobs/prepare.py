"""Preparing the jobs of a launch, for every ddpw launcher: each job's config composed once, numbered, its `platform`
read and checked (every job before the first starts), its output dir and `${now:...}` values pinned when it starts
(docs/architecture.md, "Pinned per job, when it starts")."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log, filter_overrides, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import LauncherOptions
from ddpw_conf.platform import keys_where
from ddpw_runtime.hydra_jobs.compose_once import forget_unused, job_config
from ddpw_runtime.hydra_jobs.mandatory import check_given
from ddpw_runtime.launch.checks import check


@dataclass
class JobToRun:
    """A job of a launch to prepare: its number, its overrides, and where it ran before (a resumed sweep's job runs
    in the same output dir, whatever `${now:...}` gives now)."""

    idx: int
    overrides: list[str]
    earlier_output_dir: Path | None = None


@dataclass
class PreparedJob:
    """One Hydra job, ready to run."""

    idx: int
    overrides: list[str]
    config: DictConfig
    platform: Platform
    output_dir: Path
    """The job's output dir: once pinned, the one it runs in; before, the one its keys give now."""
    earlier_output_dir: Path | None = None
    """Where the job ran before (a resumed sweep): its output dir once pinned."""
    pinned: bool = False
    dir_keys: ClassVar[tuple[str, str]] = ("hydra.sweep.dir", "hydra.sweep.subdir")
    """`run_job`'s output dir keys for a job of a sweep: a subdir of the sweep dir."""

    def pin(self) -> None:
        """Resolve the job's output dir (its `dir_keys`, written back as plain values) and every `${now:...}` of its
        task config, once. Sets `HydraConfig` for a moment: call it where the job holds the process's state."""
        if not self.pinned:
            values = _dir_values(self.config)
            if self.earlier_output_dir is not None:
                values[1] = os.path.relpath(self.earlier_output_dir, Path(values[0]).absolute())
            with read_write(self.config.hydra), open_dict(self.config.hydra):
                for key, value in zip(self.dir_keys, values, strict=True):
                    OmegaConf.update(self.config, key, value, merge=False)
            self.output_dir = Path(*values).absolute()
            pin_now(self.config)
            self.pinned = True

    @property
    def shown(self) -> str:
        """The job's overrides as Hydra shows them (`#3 : lr=0.1 seed=2`)."""
        return " ".join(filter_overrides(self.overrides))


def job_check(options: LauncherOptions, platform: Platform) -> None:
    """Every check of a job's platform with these options (and GPUs); errors name its keys as the user types them."""
    with options.naming_platform_keys():
        check(platform, here=options.runs_here)
        options.validate_platform(platform)


def prepare_jobs(hydra_context: HydraContext, config: DictConfig, to_run: Sequence[JobToRun],
                 options: LauncherOptions) -> list[PreparedJob]:
    """Check the options, then every job of the batch that runs: composed (once), numbered, its platform read and
    checked (`ConfigError`); jobs submitted elsewhere are pinned now, jobs that run here as each starts."""
    options.validate()
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    jobs = []
    try:
        for job in to_run:
            job_cfg = job_config(hydra_context, config, job.overrides)
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = str(job.idx)  # a str field: an int is converted, with a warning on omegaconf 2.4
                job_cfg.hydra.job.num = job.idx
            jobs.append(prepared(job_cfg, job.idx, job.overrides, options, pin=not options.runs_here,
                                 earlier_output_dir=job.earlier_output_dir))
    finally:
        forget_unused(hydra_context)
    _own_output_dirs(jobs)
    return jobs


def _own_output_dirs(jobs: Sequence[PreparedJob]) -> None:
    """`ConfigError` when two jobs would run in one output dir (a `hydra.sweep.subdir` the same for both): they may
    run side by side, and their rank logs would mix, each overwriting the other's stacks, recorder dumps and files."""
    first: dict[Path, PreparedJob] = {}
    for job in jobs:
        other = first.setdefault(job.output_dir, job)
        if other is not job:
            sweep = cast(dict[str, Any], OmegaConf.to_container(job.config.hydra.sweep, resolve=False))
            subdir = sweep["subdir"]  # as the user wrote it
            raise ConfigError(
                "hydra.sweep.subdir", subdir,
                f"jobs #{other.idx} and #{job.idx} of the sweep would run in the same output dir {job.output_dir}: "
                "a sweep's jobs may run side by side, and their rank logs would mix, each overwriting the other's "
                "files; give each job a subdir of its own, as Hydra's default hydra.sweep.subdir="
                "${hydra.job.num} does (or one built from the overrides, ${hydra.job.override_dirname})")


def prepared(config: DictConfig, idx: int, overrides: list[str], options: LauncherOptions, pin: bool = True,
             earlier_output_dir: Path | None = None) -> PreparedJob:
    """One composed job config made a `PreparedJob`: platform read and checked with `options`; output dir
    (`earlier_output_dir` where it ran before) and `${now:}` pinned with `pin` (else `PreparedJob.pin` does it)."""
    with hydra_config_of(config):
        check_given(config, options.platform_key)
        platform = options.platform_of(config)
    job_check(options, platform)
    saved = copy.deepcopy(OmegaConf.get_cache(config))  # where `${now:...}` keeps what it resolved: put back
    try:  # the output dir its keys give now, leaving nothing pinned
        job = PreparedJob(idx, overrides, config, platform, earlier_output_dir or Path(*_dir_values(config)).absolute(),
                          earlier_output_dir)
    finally:
        OmegaConf.set_cache(config, saved)
    if pin:
        job.pin()
    return job


@contextmanager
def hydra_config_of(config: DictConfig) -> Iterator[None]:
    """`HydraConfig` set to `config`'s while the block runs (`${hydra:...}` resolves against it)."""
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(config)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = saved


def _dir_values(config: DictConfig) -> list[str]:
    with hydra_config_of(config):
        return [str(OmegaConf.select(config, key)) for key in PreparedJob.dir_keys]


def task_config(config: DictConfig) -> DictConfig:
    """The task's config, as `run_job` makes it from the job's (a copy without `hydra`)."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def as_typed(overrides: Any) -> tuple[str, ...]:
    """Hydra's `overrides` (such as `hydra.overrides.task`) as typed: an interpolation in one (`${oc.env:LOCAL_RANK}`,
    which only a rank can resolve) is kept, not resolved."""
    typed = OmegaConf.to_container(overrides, resolve=False)
    assert isinstance(typed, list)
    return tuple(typed)


def command_line(hydra: Any, task: Sequence[str] | None = None) -> tuple[str, ...]:
    """Every override of the command line, as typed: the task's (`task`, else `hydra.overrides.task`), then Hydra's
    own; `hydra` is Hydra's config (`config.hydra`, `HydraConfig.get()`). The nodes of a job across machines compare
    theirs."""
    return (as_typed(hydra.overrides.task) if task is None else tuple(task)) + as_typed(hydra.overrides.hydra)


def pin_now(config: DictConfig) -> None:
    """Resolve every `${now:...}` of the task's config once, here: Hydra's `now` resolver caches its result in the
    config, which travels with it, so every rank (and `.hydra/config.yaml`) gets the same time."""
    plain = OmegaConf.to_container(config, resolve=False)
    assert isinstance(plain, dict)
    for path in keys_where({key: value for key, value in plain.items() if key != "hydra"},
                           lambda value: isinstance(value, str) and "${now:" in value):
        OmegaConf.select(config, path, throw_on_resolution_failure=False, throw_on_missing=False)

