"""Hydra's own launcher conformance suites, run against `hydra/launcher=ddpw_cpu` with 1 and 2 ranks.

The suites (`hydra.test_utils.launcher_common_tests`) are the ones every Hydra launcher plugin runs
(hydra-joblib-launcher, hydra-submitit-launcher, ...), with the fixtures of Hydra's pytest plugin
(`hydra_sweep_runner`, `hydra_restore_singletons`, from `hydra.extra.pytest_plugin`).

Two adaptations, both forced by where ddpw keeps a job's resources (the job config's `platform` node,
brought by the launcher option, not `hydra.launcher.*`):

* The rank count cannot be given as a `platform.n_procs_per_node=N` command-line override: the suites
  compare each job's override list, `multirun.yaml`'s task overrides and `override_dirname` exactly,
  and a `platform.*` override is a task override that would show up in all three (a `hydra.launcher.*`
  override, as joblib's tests use, does not). So:
    - LauncherTestSuite / BatchedSweeperTestSuite select a test-only launcher option `ddpw_cpu_ranksN`
      = `ddpw_cpu` + `platform.n_procs_per_node: N` (registered below);
    - IntegrationTestSuite writes `platform: {n_procs_per_node: N}` into the app's primary config next
      to `override hydra/launcher: ddpw_cpu`, which is how a user sets it in a config file.
* The suites compare `JobReturn.cfg` with the app's config exactly, and the launcher option adds a
  `platform` node to every job config. The `hydra_sweep_runner` fixture below checks that node (and that
  N ranks really ran: N rank values, N rank logs in the job dir) and then drops it from `JobReturn.cfg`
  before the suite's own assertions run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from hydra.test_utils.test_utils import SweepTaskFunction, integration_test
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.hydra_ddpw_launcher.local_launcher import DdpwLocalLauncher

RANKS = (1, 2)
LAUNCHERS: Dict[str, int] = {f"ddpw_cpu_ranks{n}": n for n in RANKS}
"""Test-only launcher options: `ddpw_cpu` with `platform.n_procs_per_node` fixed to the value."""


def _register_test_launchers() -> None:
    # Registered at import, so every `hydra_restore_singletons` snapshot contains them.
    for name, n in LAUNCHERS.items():
        ConfigStore.instance().store(
            group="hydra/launcher",
            name=name,
            node={"defaults": ["ddpw_cpu", "_self_"], "platform": {"n_procs_per_node": n}},
            package="_global_",
            provider="hydra-ddpw-tests",
        )


_register_test_launchers()

pytestmark = pytest.mark.filterwarnings(
    # The suites' apps use Hydra's pre-1.2 default `hydra.job.chdir`; Hydra warns about it in `run_job`,
    # whichever launcher calls it (its basic launcher included).
    "ignore:Future Hydra versions will no longer change working directory:UserWarning"
)


# ----------------------------------------------------------------------------------------- fixtures
class _CheckedSweep:
    """Wraps Hydra's SweepTaskFunction (which stays the task function, so nothing from this module has to
    be pickled into the ranks). On entry, checks every job ran on `n_ranks` ranks, then drops the
    `platform` node the launcher option put into each job config, so the suites' exact config
    comparisons see the app's own config."""

    def __init__(self, sweep: SweepTaskFunction, n_ranks: int) -> None:
        self._sweep = sweep
        self._n_ranks = n_ranks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sweep, name)

    def __enter__(self) -> "_CheckedSweep":
        self._sweep.__enter__()
        for batch in self._sweep.returns or []:
            for job_ret in batch:
                self._check_and_strip(job_ret)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sweep.__exit__(*exc)

    def _check_and_strip(self, job_ret: JobReturn) -> None:
        assert job_ret.status is JobStatus.COMPLETED, job_ret._return_value
        cfg = job_ret.cfg
        assert isinstance(cfg, DictConfig)
        assert OmegaConf.select(cfg, "platform.n_procs_per_node") == self._n_ranks, OmegaConf.to_yaml(cfg)
        rank_values = getattr(job_ret, "rank_values", None)
        assert rank_values is not None and len(rank_values) == self._n_ranks, rank_values
        assert all(v == rank_values[0] for v in rank_values), rank_values
        assert job_ret.working_dir is not None
        for rank in range(self._n_ranks):
            assert (Path(job_ret.working_dir) / f"rank_{rank}.log").is_file(), os.listdir(job_ret.working_dir)
        stripped = cfg.copy()
        with open_dict(stripped):
            stripped.pop("platform")
        job_ret.cfg = stripped


@pytest.fixture
def hydra_sweep_runner(launcher_name: str) -> Any:
    """Hydra's `hydra_sweep_runner` (same signature), returning a `_CheckedSweep`."""
    n_ranks = LAUNCHERS[launcher_name]

    def _(
        calling_file: Optional[str],
        calling_module: Optional[str],
        task_function: Any,
        config_path: Optional[str],
        config_name: Optional[str],
        overrides: Optional[List[str]],
        temp_dir: Optional[Path] = None,
        configure_logging: bool = False,
    ) -> _CheckedSweep:
        sweep = SweepTaskFunction()
        sweep.calling_file = calling_file
        sweep.calling_module = calling_module
        sweep.task_function = task_function
        sweep.config_path = config_path
        sweep.config_name = config_name
        sweep.overrides = overrides or []
        sweep.temp_dir = str(temp_dir)
        sweep.configure_logging = configure_logging
        return _CheckedSweep(sweep, n_ranks)

    return _


# ----------------------------------------------------------------------------------------- plugin
def test_discovery() -> None:
    """Hydra's plugin discovery lists the ddpw launcher."""
    assert DdpwLocalLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]


def test_info_plugins_lists_launcher(tmp_path: Path) -> None:
    """`python app.py --info plugins` lists the launcher, and the launcher options are in its search path."""
    app = tmp_path / "app.py"
    app.write_text(
        "import hydra\n\n"
        "@hydra.main(version_base=None, config_path=None)\n"
        "def main(cfg):\n    pass\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    out = subprocess.run(
        [sys.executable, str(app), "--info", "plugins"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    launchers = out.stdout.split("Launcher:", 1)[1].split("Sweeper:", 1)[0]
    assert "DdpwLocalLauncher" in launchers.split(), out.stdout
    # Another installed plugin may have a class of the same name; ours is the one discovery finds here.
    found = {f"{c.__module__}.{c.__qualname__}" for c in Plugins.instance().discover(Launcher)}
    assert "hydra_plugins.hydra_ddpw_launcher.local_launcher.DdpwLocalLauncher" in found
    out = subprocess.run(
        [sys.executable, str(app), "--info", "defaults", "hydra/launcher=ddpw_cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "hydra/launcher/ddpw_cpu" in out.stdout, out.stdout


def test_plugin_import_does_not_import_torch() -> None:
    """Hydra imports every module under hydra_plugins at each start-up: that must not pull in torch."""
    code = (
        "import hydra_plugins.hydra_ddpw_launcher.config, hydra_plugins.hydra_ddpw_launcher.local_launcher, sys\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "Plugins.instance().discover(Launcher)\n"
        "assert 'torch' not in sys.modules, 'torch was imported by plugin discovery'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------------------------- suites
@pytest.mark.parametrize("launcher_name, overrides", [(name, []) for name in LAUNCHERS], ids=list(LAUNCHERS))
class TestDdpwLauncher(LauncherTestSuite):
    """Hydra's LauncherTestSuite on ddpw_cpu with 1 and 2 ranks per job."""


@pytest.mark.parametrize(
    "launcher_name, overrides",
    [(name, ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"]) for name in LAUNCHERS],
    ids=list(LAUNCHERS),
)
class TestDdpwLauncherBatchedSweeper(BatchedSweeperTestSuite):
    """Hydra's BatchedSweeperTestSuite: 6 jobs in 3 batches of 2, each job on 1 or 2 ranks."""


def _integration_cfg(n_ranks: int) -> Dict[str, Any]:
    return {
        "defaults": [
            {"override hydra/launcher": "ddpw_cpu"},
            {"override hydra/hydra_logging": "hydra_debug"},
            {"override hydra/job_logging": "disabled"},
        ],
        "platform": {"n_procs_per_node": n_ranks},
    }


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [(_integration_cfg(2), ["-m"])], ids=["ranks2"])
class TestDdpwLauncherIntegration(IntegrationTestSuite):
    """Hydra's IntegrationTestSuite: real `python task.py -m ...` programs, each job on 2 ranks (the
    in-process suites above cover 1 rank too; each program here costs seconds, so one world size)."""


@pytest.mark.parametrize("n_ranks", RANKS)
def test_integration_app_runs_on_n_ranks(tmpdir: Any, n_ranks: int) -> None:
    """The integration suite's kind of app sees the launched world inside its task (every rank writes the
    same lines to the same file, so they agree)."""
    integration_test(
        tmpdir=Path(str(tmpdir)),
        task_config=OmegaConf.create(_integration_cfg(n_ranks)),
        overrides=["-m"],
        prints=[
            "os.environ['WORLD_SIZE']",
            "str(__import__('torch.distributed').distributed.get_world_size())",
            "str(cfg.platform.n_procs_per_node)",
        ],
        expected_outputs=[str(n_ranks)] * 3,
    )
