"""Launching ranks in Hydra's run mode.

Hydra uses a launcher only in multirun, and a launcher option cannot change the mode. The `ddpw` config
node (in the user's defaults list) sets `hydra.mode` through the `ddpw_mode` resolver, so a plain
`python app.py hydra/launcher=ddpw_cpu` goes through the launcher; with another launcher it resolves to
null and nothing changes. `RunModeCheck` refuses a run that selected a ddpw launcher without that node.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

MODE_RESOLVER = "ddpw_mode"
SWEEP_DIR_RESOLVER = "ddpw_sweep_dir"
_MULTIRUN_FLAGS = ("-m", "--multirun")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def started_with_multirun_flag() -> bool:
    """Whether this program was started with Hydra's `-m` / `--multirun` flag."""
    return any(arg in _MULTIRUN_FLAGS for arg in sys.argv[1:])


def _mode(enabled: Any) -> Optional[str]:
    return "MULTIRUN" if _truthy(enabled) else None


def _sweep_dir(enabled: Any, run_dir: str, sweep_dir: str) -> str:
    return run_dir if _truthy(enabled) and not started_with_multirun_flag() else sweep_dir


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def lone_run(config: DictConfig, n_jobs: int, initial_job_idx: int) -> bool:
    """Whether a launch of `n_jobs` jobs is the whole of a plain run: one job, started without `-m`,
    with Hydra's basic sweeper and nothing to sweep (in the overrides or `hydra.sweeper.params`). Such
    a job goes to the run dir itself, where a normal run puts its output; the jobs of any sweep, the
    first included, get one subdir each (a sweeper may launch its first job alone, as
    `hydra.sweeper.max_batch_size=1` or Optuna's `n_jobs=1` do)."""
    if n_jobs != 1 or initial_job_idx != 0 or config.hydra.sweep.dir != config.hydra.run.dir:
        return False
    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return False
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    overrides = [*config.hydra.overrides.task, *(f"{key}={value}" for key, value in params.items())]
    return not any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides))


def register_resolvers() -> None:
    """Register the resolvers the `ddpw` node uses (idempotent)."""
    for name, fn in ((MODE_RESOLVER, _mode), (SWEEP_DIR_RESOLVER, _sweep_dir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


_ENABLED = "${oc.select:hydra.launcher.launch_in_run_mode,false}"
RUN_MODE_NODE = {
    "hydra": {
        "mode": "${%s:%s}" % (MODE_RESOLVER, _ENABLED),
        "sweep": {
            "dir": "${%s:%s,${hydra.run.dir},'multirun/${now:%%Y-%%m-%%d}/${now:%%H-%%M-%%S}'}"
            % (SWEEP_DIR_RESOLVER, _ENABLED)
        },
    }
}
"""Content of the `ddpw` config node (package `_global_`)."""

ADVICE = (
    "add `- ddpw` to the defaults list of your primary config (before `_self_`), for example\n\n"
    "    defaults:\n"
    "      - ddpw\n"
    "      - override hydra/launcher: ddpw_cpu\n"
    "      - _self_\n\n"
    "or start a multirun with `-m`."
)


class RunModeCheck(Callback):
    """Refuses a plain run that selected a ddpw launcher but would start only one process."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Exit with status 2 and advice when a ddpw launcher is selected in run mode."""
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if ".hydra_ddpw_launcher." in target:
            sys.stderr.write(
                "Error: a ddpw launcher is selected, but Hydra runs this program as a single process "
                "(launchers are used only in multirun). To start the ranks, " + ADVICE + "\n"
            )
            sys.exit(2)
