"""examples/grad_accumulation.py: two ranks accumulating gradients with no_sync end where one process
with the equivalent batch size ends."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from ddpw_runtime import Platform, Wrapper

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes

EXAMPLE = Path(__file__).parent.parent / "examples" / "grad_accumulation.py"


def load_example() -> ModuleType:
    """The example as a module that is not importable by name, so its functions travel by value."""
    spec = importlib.util.spec_from_file_location("grad_accumulation_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_accumulated_gradients_match_the_whole_batch(tmp_path: Path) -> None:
    example = load_example()
    accumulated, whole = example.compare(micro_batch=8, accumulation=4, epochs=2, log_dir=str(tmp_path))
    assert accumulated.shape == whole.shape and accumulated.numel() > 2000
    torch.testing.assert_close(accumulated, whole, atol=1e-5, rtol=1e-4)

    # The comparison can tell: without accumulation (a batch 4 times smaller) the parameters differ.
    smaller = Wrapper(Platform(n_procs_per_node=2), log_dir=tmp_path / "control").start(example.train, 8, 1, 2)[0]
    assert (smaller - whole).abs().max().item() > 1e-2
