"""Launching ranks in Hydra's run mode.

Hydra uses a launcher only in multirun, and a launcher option cannot change the mode. The `ddpw` config
node (in the user's defaults list) sets `hydra.mode` through the `ddpw_mode` resolver, so a plain
`python app.py hydra/launcher=ddpw_cpu` goes through the launcher; with another launcher it resolves to
null and nothing changes. `RunModeCheck` refuses a run that selected a ddpw launcher without that node.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

MODE_RESOLVER = "ddpw_mode"
SWEEP_DIR_RESOLVER = "ddpw_sweep_dir"
_MULTIRUN_FLAGS = ("-m", "--multirun")


def started_with_multirun_flag() -> bool:
    """Whether this program was started with Hydra's `-m` / `--multirun` flag."""
    return any(arg in _MULTIRUN_FLAGS for arg in sys.argv[1:])


def _mode(enabled: Any) -> Optional[str]:
    return "MULTIRUN" if _truthy(enabled) else None


def _sweep_dir(enabled: Any, run_dir: str, sweep_dir: str) -> str:
    return run_dir if _truthy(enabled) and not started_with_multirun_flag() else sweep_dir


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


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
