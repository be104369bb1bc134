"""Hydra's own launcher conformance suites, run against `hydra/launcher=ddpw_cpu` as the official
launcher plugins run them (hydra-joblib-launcher, hydra-submitit-launcher): Hydra's own fixtures
(`hydra_sweep_runner`, `hydra_restore_singletons`, from its pytest plugin), the suites unchanged.

One difference from Hydra's basic launcher is by design, and the tests that see it say so: the launcher
option puts a `platform` node into every job's config (so `platform.n_gpus_per_node=4` needs no `+` in
a repo that knows nothing of hydra-ddpw, and `platform.*` can be swept), so a job's `JobReturn.cfg`
holds `platform` besides the app's own config. The suite tests that compare `JobReturn.cfg` with the
app's config exactly are expected to fail on that node alone (`PLATFORM_NODE`); each such test is also
run with `platform` taken out (`test_suite_config_is_the_apps_plus_platform`), where it must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from hydra.test_utils.test_utils import integration_test
from omegaconf import OmegaConf

from ddpw_conf import Platform
from hydra_plugins.hydra_ddpw_launcher.local_launcher import DdpwLocalLauncher
from tests.helpers import run_python

pytestmark = [
    # The suites' apps use Hydra's pre-1.2 default `hydra.job.chdir`; Hydra warns about it in `run_job`,
    # whichever launcher calls it (its basic launcher included).
    pytest.mark.filterwarnings("ignore:Future Hydra versions will no longer change working directory:UserWarning"),
    pytest.mark.subprocess,
]

PLATFORM_NODE = pytest.mark.xfail(
    strict=True,
    reason="by design: the job config holds the `platform` node the ddpw launcher option brings, which "
    "the suite's exact comparison with the app's config does not expect",
)
"""The suite tests that compare a job's config with the app's config exactly."""


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
    out = run_python(code)
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------------------------- suites
@pytest.mark.parametrize("launcher_name, overrides", [("ddpw_cpu", [])])
class TestDdpwLauncher(LauncherTestSuite):
    """Hydra's LauncherTestSuite on `hydra/launcher=ddpw_cpu`; the tests that compare a job's config with
    the app's exactly fail on the `platform` node alone (see the module docstring)."""

    test_sweep_1_job = PLATFORM_NODE(LauncherTestSuite.test_sweep_1_job)
    test_sweep_2_jobs = PLATFORM_NODE(LauncherTestSuite.test_sweep_2_jobs)
    test_sweep_1_job_strict = PLATFORM_NODE(LauncherTestSuite.test_sweep_1_job_strict)
    test_sweep_2_optimizers = PLATFORM_NODE(LauncherTestSuite.test_sweep_2_optimizers)
    test_sweep_over_unspecified_mandatory_default = PLATFORM_NODE(
        LauncherTestSuite.test_sweep_over_unspecified_mandatory_default
    )
    test_sweep_and_override = PLATFORM_NODE(LauncherTestSuite.test_sweep_and_override)


@pytest.mark.parametrize(
    "launcher_name, overrides", [("ddpw_cpu", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])]
)
class TestDdpwLauncherBatchedSweeper(BatchedSweeperTestSuite):
    """Hydra's BatchedSweeperTestSuite: 6 jobs in 3 batches of 2 (its one test compares job configs)."""

    test_sweep_2_jobs_2_batches = PLATFORM_NODE(BatchedSweeperTestSuite.test_sweep_2_jobs_2_batches)


def test_suite_config_is_the_apps_plus_platform(hydra_sweep_runner: Any, tmpdir: Any) -> None:
    """The suites' two-job sweep, checked as Hydra's `sweep_2_jobs` checks it, but for the `platform`
    node: every job's config is the app's plus the `platform` node of `ddpw_cpu` (a whole Platform on
    device cpu), and every value the suite expects is there, with each job run on its ranks."""
    sweep = hydra_sweep_runner(
        calling_file=None, calling_module="hydra.test_utils.a_module", task_function=None,
        config_path="configs", config_name="compose", overrides=["hydra/launcher=ddpw_cpu", "+a=0,1"],
        temp_dir=Path(str(tmpdir)),
    )
    with sweep:
        assert sweep.returns is not None and len(sweep.returns[0]) == 2
        for i, job_ret in enumerate(sweep.returns[0]):
            cfg = OmegaConf.to_container(job_ret.cfg)
            assert isinstance(cfg, dict)
            platform = cfg.pop("platform")
            assert cfg == {"foo": 10, "bar": 100, "a": i} and job_ret.overrides == [f"+a={i}"]
            assert platform == OmegaConf.to_container(OmegaConf.structured(Platform(device="cpu")))
            assert job_ret.rank_values == [job_ret.return_value]  # one rank: the platform's default
            assert (Path(job_ret.working_dir) / "rank_0.log").is_file()


def _integration_cfg(n_ranks: int) -> dict[str, Any]:
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
    """Hydra's IntegrationTestSuite: real `python task.py -m ...` programs, each job on 2 ranks."""


@pytest.mark.parametrize("n_ranks", (1, 2))
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


@pytest.mark.parametrize("version_base", ["1.1", None], ids=["hydra-1.1-defaults", "current-defaults"])
def test_hydras_job_warnings_show_once_per_multirun_as_under_its_own_launcher(
        tmp_path: Path, version_base: str | None) -> None:
    """An app of Hydra 1.1's defaults (`version_base="1.1"`, as apps written before Hydra 1.2): Hydra's `run_job` warns
    that the working directory will no longer change. Hydra's launcher runs every job in one process and shows it
    once; a ddpw multirun showed it once per job, from each job's process, as if hydra-ddpw's code raised it."""
    app = tmp_path / "app.py"
    app.write_text(f"import hydra\n\n@hydra.main(version_base={version_base!r}, config_path=None)\n"
                   "def main(cfg):\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    counts = []
    for launcher in ("basic", "ddpw_cpu"):
        out = subprocess.run([sys.executable, str(app), "-m", f"hydra/launcher={launcher}", "+x=1,2,3"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        counts.append(out.stderr.count("Future Hydra versions will no longer change working directory"))
    assert counts == ([1, 1] if version_base else [0, 0]), counts
