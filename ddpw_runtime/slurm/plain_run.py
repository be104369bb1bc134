"""A plain run (no `-m`) with `hydra/launcher=ddpw_slurm` is refused before anything starts, naming `-m`, which
submits the job (a sweep of one) and waits for it (a plain run would have to submit its task from a callback and end
without running it: Hydra has no public way to do that)."""

from __future__ import annotations

from typing import Any

from hydra.types import RunMode
from omegaconf import DictConfig

from ddpw_conf import ConfigError
from ddpw_conf.launcher import SlurmLauncherConf, selected_options
from ddpw_runtime import _compat
from ddpw_runtime.procs.plain_run import PlainRun


class SlurmPlainRun(PlainRun):
    """The plain-run callback of `hydra/launcher=ddpw_slurm` (see the module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Refuse a plain run, naming the command that submits the job."""
        options = _compat.report_like_hydra(lambda: selected_options(config.hydra.launcher))
        if isinstance(options, SlurmLauncherConf) and config.hydra.mode is not RunMode.MULTIRUN:
            _compat.report_like_hydra(_refuse)


def _refuse() -> None:
    raise ConfigError(
        "hydra/launcher", "ddpw_slurm", "jobs are submitted to SLURM in a multirun: add -m to the command "
        "(python train.py -m hydra/launcher=ddpw_slurm ...), which submits this one job and waits for it",
    )
