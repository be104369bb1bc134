"""hydra-ddpw's one-device check on Lightning and Fabric in a rank stops only what would train once per rank:
a Trainer that tests, validates or predicts at one device after the job's fit runs (as Lightning's own warning
advises, and as under torchrun), a Fabric that only infers at one device runs, and the check travels with a
Trainer whose strategy starts processes of its own (`ddp_spawn`)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from ddpw_conf import Platform
from ddpw_runtime import Wrapper
from tests.lightning_entry_points import register_library_checks

QUIET: dict[str, Any] = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False,
                         "enable_progress_bar": False, "enable_model_summary": False}
"""A Trainer's arguments that keep a test's output and files to what it asserts."""


def fit_then_evaluate_at_one_device() -> dict[str, Any]:
    """Fit in the job's world, then validate, test and predict with `Trainer(devices=1)`; what each saw."""
    import lightning as L

    from tests.lightning_tiny import Tiny, samples

    model = Tiny()
    fitting = L.Trainer(max_epochs=1, **QUIET)
    fitting.fit(model, samples())
    evaluating = L.Trainer(devices=1, **QUIET)
    return {
        "fit_world_size": fitting.world_size,
        "evaluate_world_size": evaluating.world_size,
        "validated": sorted(evaluating.validate(model, samples(), verbose=False)[0]),
        "tested": sorted(evaluating.test(model, samples(), verbose=False)[0]),
        "predicted": len(evaluating.predict(model, samples()) or []),
    }


@pytest.mark.subprocess
def test_a_trainer_at_one_device_validates_tests_and_predicts_after_the_jobs_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    values = Wrapper(Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path).start(
        fit_then_evaluate_at_one_device)
    expected = {"fit_world_size": 2, "evaluate_world_size": 1, "validated": ["val"], "tested": ["test"],
                "predicted": 2}
    assert values == [expected, expected]


def infer_with_fabric_at_one_device(setup: str) -> tuple[int, list[int]]:
    """A Fabric at one device that sets a model up without an optimizer (`setup`: `setup` or `setup_module`)
    and runs it; the Fabric's world size and the output's shape."""
    import torch
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    model = getattr(fabric, setup)(torch.nn.Linear(4, 1))
    with torch.no_grad():
        output = model(torch.randn(3, 4))
    return fabric.world_size, list(output.shape)


@pytest.mark.subprocess
def test_a_fabric_at_one_device_that_only_infers_runs_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    wrapper = Wrapper(Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path)
    assert wrapper.start(infer_with_fabric_at_one_device, "setup") == [(1, [3, 1])] * 2
    assert wrapper.start(infer_with_fabric_at_one_device, "setup_module") == [(1, [3, 1])] * 2


def fit_with_ddp_spawn() -> tuple[int, bool, bool]:
    """`Trainer(devices=2, strategy="ddp_spawn")` (the Lightning + Hydra template's `trainer=ddp_sim`)
    fits: the Trainer's world size, whether hydra-ddpw's check is among its callbacks, and whether the
    weights the spawned processes trained came back."""
    import lightning as L
    import torch

    from tests.lightning_tiny import Tiny, samples

    trainer = L.Trainer(devices=2, strategy="ddp_spawn", max_epochs=1, **QUIET)
    model = Tiny()
    before = model.layer.weight.detach().clone()
    trainer.fit(model, samples())
    callbacks = trainer.callbacks  # type: ignore[attr-defined]  # set on the Trainer by Lightning's connector
    checked = any(type(callback).__name__ == "TrainerCheck" for callback in callbacks)
    return trainer.world_size, checked, not torch.equal(before, model.layer.weight.detach())


@pytest.mark.subprocess
def test_a_trainer_with_ddp_spawn_takes_the_check_into_its_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a 1-rank job, as under `torchrun --nproc_per_node=1`, Lightning's ddp_spawn runs and hands back its
    # result; before, pickling the Trainer's callbacks for the spawned processes failed on hydra-ddpw's check.
    register_library_checks(monkeypatch, tmp_path / "entry_points")
    values = Wrapper(Platform(n_procs_per_node=1, verbose=False), log_dir=tmp_path).start(fit_with_ddp_spawn)
    assert values == [(1, True, True)]  # the world Lightning takes from torchrun's variables


def test_the_trainer_check_pickles_as_itself() -> None:
    from lightning.pytorch import Callback

    from ddpw_runtime.rank.libraries import FabricCheck, trainer_check

    check = trainer_check("lightning.pytorch")
    copy = pickle.loads(pickle.dumps(check))
    assert type(copy) is type(check) and isinstance(copy, Callback)
    assert type(pickle.loads(pickle.dumps(FabricCheck()))) is FabricCheck
