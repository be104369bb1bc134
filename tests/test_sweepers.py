"""Sweepers driving the launcher: an Optuna study whose trials are 2-rank jobs, and Hydra's basic
sweeper in batches (`hydra.sweeper.max_batch_size`). The objective (`tests/apps/sweep_app.py`) is
(x - 1)^2 on rank 0 and a decoy of -1000 on the other ranks, so a sweeper that read any rank but 0
would report the decoy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import job_dirs, run_app, seen

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def check_two_rank_jobs(jobs: list[Path]) -> list[dict]:
    """Each job ran 2 ranks (2 processes); rank 0's report of each job, in job order."""
    reports = []
    for job in jobs:
        ranks = seen(job)
        assert sorted(ranks) == [0, 1], job
        assert ranks[0]["pid"] != ranks[1]["pid"]
        assert {r["world_size"] for r in ranks.values()} == {2}
        reports.append(ranks[0])
    return reports


def test_optuna_study_of_two_rank_trials_reports_rank_0s_best(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", app="sweep_app.py")  # conf/optuna.yaml: 4 trials, 2 per batch
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1", "2", "3"]
    trials = check_two_rank_jobs(jobs)
    assert [t["job_num"] for t in trials] == [0, 1, 2, 3]
    (results_file,) = tmp_path.glob("multirun/*/*/optimization_results.yaml")
    results = yaml.safe_load(results_file.read_text())
    best = min(trials, key=lambda t: t["value"])
    assert results["best_value"] == best["value"] == (best["x"] - 1.0) ** 2
    assert results["best_params"] == {"x": best["x"]}
    assert f"Best value: {best['value']}" in proc.stdout + proc.stderr
    for job in range(4):
        assert f"[ddpw] job #{job} started: 2 ranks on cpu" in proc.stdout


def test_basic_sweeper_in_batches_numbers_jobs_across_batches(tmp_path: Path) -> None:
    overrides = ("--config-name", "sweep", "x=0,1,2,3", "hydra.sweeper.max_batch_size=2")
    proc = run_app(tmp_path, "-m", *overrides, app="sweep_app.py")
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1", "2", "3"]  # the second batch starts at job 2
    trials = check_two_rank_jobs(jobs)
    assert [(t["job_num"], t["x"]) for t in trials] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    starts = [line for line in proc.stdout.splitlines() if line.startswith("[ddpw] job #")]
    assert [line.split()[2] for line in starts if "started" in line] == ["#0", "#1", "#2", "#3"]
