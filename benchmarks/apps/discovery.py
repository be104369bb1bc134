"""Hydra's start-up work that plugins add to, timed in a fresh process: `python discovery.py PLUGINS_DIR`.

PLUGINS_DIR holds the `hydra_plugins` package the plugin scan sees (the driver makes one mirroring this
environment's plugins, with or without hydra-ddpw's; see suite/sections.py). Times, in this order:
- discovery: `Plugins.instance()`, the scan of every module under `hydra_plugins` that every Hydra app
  runs at start-up;
- compose: composing an app config that knows nothing of hydra-ddpw (conf_plain/plain.yaml, with
  Hydra's own config), which goes through the search path every search path plugin adds to.
Writes wall and CPU seconds of each as the marks of rank 0 of job "discovery" (rank_work.write_marks).
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, sys.argv[1])  # before anything imports hydra_plugins

import hydra  # noqa: E402,F401 - what every Hydra app imports before the scan, outside the timing
import rank_work  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.plugins import Plugins  # noqa: E402


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of `fn()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def compose_plain() -> None:
    """Compose the plain app's config as an app run does (Hydra's own config included)."""
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf_plain"), version_base=None):
        compose(config_name="plain", return_hydra_config=True)


if __name__ == "__main__":
    before = set(sys.modules)
    discovery = timed(Plugins.instance)
    imported = sorted(set(sys.modules) - before)
    compose_s = timed(compose_plain)
    rank_work.write_marks("discovery", 0, {
        "discovery_wall": discovery[0], "discovery_cpu": discovery[1],
        "compose_wall": compose_s[0], "compose_cpu": compose_s[1],
        "modules_imported": len(imported),
        "ddpw_plugin_scanned": "hydra_plugins.hydra_ddpw_launcher" in imported,
        "ddpw_conf_imported": any(name.startswith(("ddpw_conf", "ddpw_runtime")) for name in sys.modules),
    })
