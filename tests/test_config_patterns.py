"""Research-repo config patterns with the ddpw launcher: a repo's own platform presets (checked against
the `Platform` schema), Hydra's job environment and runtime values in every rank,
`--cfg` / `--info`, and the dry run. The app is `tests/apps/patterns_app.py` (config `patterns.yaml`,
presets in `conf/platform/`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import APPS, job_dirs, seen

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes

COPIED = "copied-from-the-launching-shell"


def run_patterns(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python tests/apps/patterns_app.py <overrides>` in `cwd`, with the variable that
    `hydra.job.env_copy` names set (Hydra refuses to compose without it)."""
    env: dict[str, str] = {**os.environ, "DDPW_TEST_COPY": COPIED}
    return subprocess.run(
        [sys.executable, str(APPS / "patterns_app.py"), *overrides],
        cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env,
    )


def job_config(cwd: Path, *overrides: str) -> dict:
    """The job config that `--cfg job` prints for `overrides`."""
    proc = run_patterns(cwd, *overrides, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def nothing_started(cwd: Path) -> bool:
    """No job output dir and no rank log anywhere under `cwd`."""
    return job_dirs(cwd) == [] and not list(cwd.rglob("rank_*.log"))


def test_a_repo_preset_env_and_hydra_values_reach_every_rank(tmp_path: Path) -> None:
    proc = run_patterns(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]  # two_cpus: 2 ranks
    for data in ranks.values():
        assert data["env"] == {"DDPW_TEST_SET": "set-by-hydra", "DDPW_TEST_COPY": COPIED}
        assert data["out_dir"] == data["hydra_output_dir"] == str(job)  # ${hydra:runtime.output_dir}
        assert data["job_name"] == "patterns_app"
        assert data["platform_choice"] == "two_cpus" and data["platform_name"] == "two-cpus"
        assert data["threads"] == 1  # n_cpus_per_node 2, split over 2 ranks


def test_omp_num_threads_set_by_hydra_is_kept_in_every_rank(tmp_path: Path) -> None:
    proc = run_patterns(tmp_path, "+hydra.job.env_set.OMP_NUM_THREADS=3")
    assert proc.returncode == 0, proc.stderr
    assert [data["threads"] for data in seen(job_dirs(tmp_path)[0]).values()] == [3, 3]  # not the split's 1


def test_presets_from_the_command_line_replace_the_repo_default(tmp_path: Path) -> None:
    platform = job_config(tmp_path, "platform=a100")["platform"]
    assert (platform["name"], platform["device"], platform["n_gpus_per_node"]) == ("a100", "gpu", 8)
    assert (platform["n_cpus_per_node"], platform["mem_per_node"]) == (64, 512)
    # Fields a preset does not set keep the schema's defaults (the launcher option's `platform` node).
    assert (platform["n_nodes"], platform["timeout_min"]) == (1, 2880)
    assert nothing_started(tmp_path)


def test_an_appended_preset_keeps_the_platform_values_of_the_config(tmp_path: Path) -> None:
    # conf/config.yaml has no `platform` entry in its defaults list (so `+`), and sets
    # platform.n_procs_per_node: 2, which the `one_gpu` preset (device and GPU count only) keeps.
    platform = job_config(tmp_path, "--config-name", "config", "+platform=one_gpu")["platform"]
    assert (platform["device"], platform["n_gpus_per_node"], platform["n_procs_per_node"]) == ("gpu", 1, 2)


@pytest.mark.parametrize(
    "preset, shown",
    [
        ("wrong_type", "platform.n_gpus_per_node='eight': use an integer >= 0"),
        ("unknown_key", "platform.n_gpu_per_node=2: Platform has no such field; did you mean n_gpus_per_node?"),
    ],
)
def test_a_broken_repo_preset_is_refused_naming_key_value_and_fix(tmp_path: Path, preset: str, shown: str) -> None:
    proc = run_patterns(tmp_path, f"platform={preset}")
    assert proc.returncode != 0
    assert shown in proc.stderr, proc.stderr
    assert nothing_started(tmp_path)


def test_a_preset_this_machine_cannot_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = run_patterns(tmp_path, "platform=a100", "hydra.launcher.dry_run=true")
    assert proc.returncode != 0
    assert "platform." in proc.stderr and "--- job #0" not in proc.stdout, proc.stderr
    assert nothing_started(tmp_path)


def test_cfg_and_info_behave_as_with_any_launcher(tmp_path: Path) -> None:
    job = job_config(tmp_path)
    assert job["platform"]["name"] == "two-cpus" and job["out_dir"] == "${hydra:runtime.output_dir}"
    proc = run_patterns(tmp_path, "--cfg", "hydra")
    assert proc.returncode == 0, proc.stderr
    hydra_cfg = yaml.safe_load(proc.stdout)["hydra"]
    assert hydra_cfg["launcher"]["_target_"] == "hydra_plugins.hydra_ddpw_launcher.local_launcher.DdpwLocalLauncher"
    assert hydra_cfg["job"]["env_set"] == {"DDPW_TEST_SET": "set-by-hydra", "DDPW_TEST_COPY": COPIED}
    assert hydra_cfg["runtime"]["choices"]["platform"] == "two_cpus"
    proc = run_patterns(tmp_path, "--info")
    assert proc.returncode == 0, proc.stderr
    assert "Defaults Tree" in proc.stdout and "platform: two_cpus" in proc.stdout
    assert "hydra/launcher: ddpw_cpu" in proc.stdout
    assert nothing_started(tmp_path)


def test_dry_run_prints_each_jobs_resolved_platform_and_plan(tmp_path: Path) -> None:
    proc = run_patterns(tmp_path, "-m", "platform=two_cpus,one_cpu", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split("--- job #1")
    assert "--- job #0: platform=two_cpus (dry run, nothing started)" in first
    assert "world size      : 2 (1 node(s) x 2 rank(s))" in first and "threads per rank: 1" in first
    assert "name                        : two-cpus" in first and "rank logs       :" in first
    assert "world size      : 1 (1 node(s) x 1 rank(s))" in second
    assert "name                        : one-cpu" in second
    assert "[ddpw] job #" not in proc.stdout  # the start line is for jobs that start
    assert nothing_started(tmp_path)
