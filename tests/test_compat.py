"""Every private API of Hydra, OmegaConf, torch and submitit that `ddpw_runtime._compat` uses, checked
against the installed (pinned) versions, so an upgrade that breaks one fails here first."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import TaskFunction
from omegaconf import DictConfig, OmegaConf

from ddpw_runtime import _compat
from ddpw_runtime.errors import RankFailure


def test_hydra_state_round_trips_with_a_resolver_registered_here(hydra_restore_singletons: Any) -> None:
    OmegaConf.register_new_resolver("ddpw_test_twice", lambda text: text * 2, replace=True)
    try:
        state = cloudpickle.dumps(_compat.hydra_state())
    finally:
        OmegaConf.clear_resolver("ddpw_test_twice")
    assert not OmegaConf.has_resolver("ddpw_test_twice")
    _compat.restore_hydra_state(cloudpickle.loads(state))
    try:
        assert OmegaConf.create({"x": "${ddpw_test_twice:ab}"}).x == "abab"
    finally:
        OmegaConf.clear_resolver("ddpw_test_twice")


def test_job_error_reads_a_failed_return_without_raising() -> None:
    error = ValueError("bad")
    assert _compat.job_error(JobReturn(status=JobStatus.FAILED, _return_value=error)) is error
    assert _compat.job_error(JobReturn(status=JobStatus.COMPLETED, _return_value=3)) is None


def test_report_like_hydra_prints_a_compact_error_alone_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert _compat.report_like_hydra(lambda: 7) == 7

    def fail() -> None:
        raise RankFailure(1, 0, 1, "ValueError", "bad batch", "Traceback...\nValueError: bad batch")

    with pytest.raises(SystemExit) as info:
        _compat.report_like_hydra(fail)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("rank 1 (node 0) failed: ValueError: bad batch\n") and "test_compat.py" not in err


class _Order(Callback):
    """Records the order in which Hydra calls its callbacks."""

    seen: list[str] = []

    def __init__(self, name: str, last: bool = False) -> None:
        self.name = name
        self.last = last

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.last:
            _compat.notify_last(self)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        _Order.seen.append(self.name)


def test_notify_last_makes_a_callback_see_job_end_before_the_others() -> None:
    target = f"{__name__}._Order"
    config = OmegaConf.create({"hydra": {"callbacks": {
        "first": {"_target_": target, "name": "first", "last": True},
        "second": {"_target_": target, "name": "second"},
    }}})
    callbacks = _compat.run_callbacks(config)
    _Order.seen = []
    callbacks.on_run_start(config=config, config_name="x")
    callbacks.on_job_end(config=config, job_return=JobReturn(status=JobStatus.COMPLETED))
    assert _Order.seen == ["first", "second"]  # Hydra calls on_job_end last-to-first


def test_task_function_of_run_finds_the_function_hydra_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: Any
) -> None:
    import hydra

    found: list[TaskFunction | None] = []

    def task(cfg: DictConfig) -> None:
        found.append(_compat.task_function_of_run())

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["app.py", "hydra.run.dir=."])
    hydra.main(version_base=None, config_path=None)(task)()
    assert found == [task]
    assert _compat.task_function_of_run() is None  # outside a Hydra run


def test_hydra_main_still_reruns_through_a_module_level_loader_and_a_task_function_cell() -> None:
    module = sys.modules["hydra.main"]
    assert callable(module._get_rerun_conf)
    source = inspect.getsource(module.main)
    assert "def decorated_main(" in source and "_get_rerun_conf(" in source and "task_function(cfg)" in source


def test_the_process_group_counter_that_a_failed_init_leaves_can_be_reset() -> None:
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    saved = world.group_count
    world.group_count = 5
    try:
        _compat.forget_failed_process_group()
        assert world.group_count == 0
    finally:
        world.group_count = saved


def test_submitit_renders_the_script_and_exposes_what_the_waiting_reads() -> None:
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    script = _compat.sbatch_script("python -m x", Path("/tmp/ddpw-folder/%j"), None, nodes=2, job_name="j")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --job-name=j" in script
    assert importlib.util.find_spec(_compat.SUBMITIT_ENTRY) is not None
    assert isinstance(SlurmJob.watcher, SlurmInfoWatcher)
    assert "mode" in inspect.signature(SlurmInfoWatcher.get_state).parameters
    assert callable(SlurmInfoWatcher.update)
    assert isinstance(JobPaths.result_pickle, property)


def test_torch_without_gpu_support_is_read_without_importing_torch() -> None:
    code = ("import sys; from ddpw_runtime import _compat; known = _compat.torch_without_gpu_support(); "
            "assert 'torch' not in sys.modules; import torch; "
            "print(known, torch.version.cuda is None and torch.version.hip is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == out[1]


def test_every_private_api_is_in_compat() -> None:
    """Outside `_compat.py`, no module of the package reaches into another library's private names."""
    root = Path(__file__).resolve().parents[1] / "ddpw_runtime"
    for path in root.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        text = path.read_text()
        for private in ("._instances", "._resolvers", "._return_value", "_internal", "._make_sbatch_string",
                        ".watcher", "._world", "_get_sequence_number", "sys._getframe", "core._submit"):
            assert private not in text, f"{path.relative_to(root)} uses {private}"
    assert os.path.exists(root / "_compat.py")
