"""The helpers a task uses inside a rank, each on real gloo ranks: rank_zero_only, wrap_model /
unwrap_model / no_sync, distributed_sampler, to_device, average, all_to_all, and the layout groups."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import ddpw_runtime
from ddpw_runtime import ConfigError, Layout, Platform, RankFailure, Wrapper

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def on_ranks(tmp_path: Path, fn: Callable[..., Any], *args: Any, n: int = 2, **platform: Any) -> list[Any]:
    return Wrapper(Platform(n_procs_per_node=n, **platform), log_dir=tmp_path).start(fn, *args)


@ddpw_runtime.rank_zero_only
def rank_zero_value(x: int) -> int:
    return x * 10


def test_rank_zero_only_runs_on_rank_zero_and_outside_ranks(tmp_path: Path) -> None:
    assert on_ranks(tmp_path, rank_zero_value, 4) == [40, None]
    assert rank_zero_value(5) == 50
    assert rank_zero_value.__name__ == "rank_zero_value"


def wrapped_model(sync_batchnorm: bool) -> dict:
    torch.manual_seed(ddpw_runtime.rank())  # different weights on each rank before wrapping
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ddp = ddpw_runtime.wrap_model(model, sync_batchnorm=sync_batchnorm, broadcast_buffers=False)
    plain = ddpw_runtime.unwrap_model(ddp)
    weights = torch.cat([p.detach().flatten() for p in plain.parameters()])
    return {
        "ddp": type(ddp).__name__,
        "find_unused": ddp.find_unused_parameters,
        "broadcast_buffers": ddp.broadcast_buffers,
        "norm": type(list(plain.children())[1]).__name__,
        "unwrapped_is_inner": plain is ddp.module,
        "weights": weights.cpu(),
        "device": str(weights.device),
    }


def test_wrap_model_broadcasts_rank_zero_weights_and_passes_options(tmp_path: Path) -> None:
    first, second = on_ranks(tmp_path, wrapped_model, False)
    for seen in (first, second):
        assert seen["ddp"] == "DistributedDataParallel"
        assert seen["find_unused"] is False and seen["broadcast_buffers"] is False
        assert seen["norm"] == "BatchNorm1d" and seen["unwrapped_is_inner"]
    torch.testing.assert_close(first["weights"], second["weights"], rtol=0, atol=0)


def test_sync_batchnorm_on_cpu_ranks_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(RankFailure, match="sync_batchnorm=True needs CUDA ranks"):
        on_ranks(tmp_path, wrapped_model, True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SyncBatchNorm runs on CUDA only")
def test_sync_batchnorm_converts_on_gpu_ranks(tmp_path: Path) -> None:
    (seen,) = on_ranks(tmp_path, wrapped_model, True, n=1, device="gpu", n_gpus_per_node=1)
    assert seen["norm"] == "SyncBatchNorm" and seen["device"] == "cuda:0"


def test_unwrap_model_goes_through_every_wrapper() -> None:
    inner = nn.Linear(2, 2)
    assert ddpw_runtime.unwrap_model(nn.DataParallel(inner)) is inner
    assert ddpw_runtime.unwrap_model(inner) is inner


def gradients_with_and_without_sync() -> dict:
    torch.manual_seed(0)
    ddp = ddpw_runtime.wrap_model(nn.Linear(2, 1, bias=False))
    x = torch.full((1, 2), float(ddpw_runtime.rank() + 1))  # a different batch on each rank
    with ddpw_runtime.no_sync(ddp):
        ddp(x).sum().backward()
    local = ddp.module.weight.grad.clone()
    ddp(x).sum().backward()  # syncs what was accumulated, plus this step
    synced = ddp.module.weight.grad.clone()
    ddp.zero_grad()
    with ddpw_runtime.no_sync(ddp, skip=False):
        ddp(x).sum().backward()
    return {"local": local, "synced": synced, "not_skipped": ddp.module.weight.grad.clone()}


def test_no_sync_accumulates_locally_until_the_next_synced_backward(tmp_path: Path) -> None:
    first, second = on_ranks(tmp_path, gradients_with_and_without_sync)
    torch.testing.assert_close(first["local"], torch.tensor([[1.0, 1.0]]))
    torch.testing.assert_close(second["local"], torch.tensor([[2.0, 2.0]]))
    # accumulated (1 and 2) + this step (1 and 2), averaged over the ranks: (2 + 4) / 2
    torch.testing.assert_close(first["synced"], torch.tensor([[3.0, 3.0]]))
    torch.testing.assert_close(second["synced"], torch.tensor([[3.0, 3.0]]))
    torch.testing.assert_close(first["not_skipped"], torch.tensor([[1.5, 1.5]]))
    assert isinstance(ddpw_runtime.no_sync(nn.Linear(1, 1)), type(ddpw_runtime.no_sync(nn.Linear(1, 1), skip=False)))


def sampled_indices(epochs: int) -> list[list[int]]:
    sampler = ddpw_runtime.distributed_sampler(TensorDataset(torch.arange(10)))
    order = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order.append(list(sampler))
    return order


def test_distributed_sampler_shards_the_dataset_and_reshuffles_per_epoch(tmp_path: Path) -> None:
    first, second = on_ranks(tmp_path, sampled_indices, 2)
    for epoch in range(2):
        assert len(first[epoch]) == len(second[epoch]) == 5
        assert sorted(first[epoch] + second[epoch]) == list(range(10))
    assert first[0] != first[1]


def test_distributed_sampler_shards_over_the_data_group_only(tmp_path: Path) -> None:
    first, second = on_ranks(tmp_path, sampled_indices, 1, layout={"tensor": 2})
    assert first == second and sorted(first[0]) == list(range(10))  # one tensor-parallel pair, one replica


Pair = namedtuple("Pair", "image label")


def moved_batch() -> Any:
    batch = {"pair": Pair(torch.ones(2), torch.zeros(1)), "list": [torch.ones(1), "text", 3], "tuple": (torch.ones(1),)}
    on_rank_device = ddpw_runtime.to_device(batch)
    on_meta = ddpw_runtime.to_device(batch, torch.device("meta"))
    return on_rank_device, on_meta


def test_to_device_moves_every_tensor_of_a_nested_batch(tmp_path: Path) -> None:
    on_rank_device, on_meta = on_ranks(tmp_path, moved_batch)[1]
    assert on_rank_device["pair"].image.device.type == "cpu"
    assert isinstance(on_meta["pair"], Pair) and on_meta["pair"].image.is_meta and on_meta["pair"].label.is_meta
    assert isinstance(on_meta["list"], list) and on_meta["list"][0].is_meta and on_meta["list"][1:] == ["text", 3]
    assert isinstance(on_meta["tuple"], tuple) and on_meta["tuple"][0].is_meta


def averages() -> dict:
    r = ddpw_runtime.rank()
    tensor = torch.tensor([float(r), 10.0 * r])
    result = {
        "number": ddpw_runtime.average(r + 1),
        "tensor": ddpw_runtime.average(tensor),
        "integers": ddpw_runtime.average(torch.tensor([r, r + 1])),
        "input_kept": tensor.tolist(),
    }
    return result


def test_average_is_the_mean_over_ranks_on_every_rank(tmp_path: Path) -> None:
    for seen in on_ranks(tmp_path, averages):
        assert seen["number"] == 1.5 and isinstance(seen["number"], float)
        torch.testing.assert_close(seen["tensor"], torch.tensor([0.5, 5.0]))
        torch.testing.assert_close(seen["integers"], torch.tensor([0.5, 1.5], dtype=torch.float64))
    assert [seen["input_kept"] for seen in on_ranks(tmp_path, averages)] == [[0.0, 0.0], [1.0, 10.0]]


def exchanged() -> list[torch.Tensor]:
    r = ddpw_runtime.rank()
    # to rank i: (r + i + 1) values of 10 r + i
    return ddpw_runtime.all_to_all([torch.full((r + i + 1, 2), 10.0 * r + i) for i in range(2)])


def test_all_to_all_sends_each_rank_its_tensor_whatever_the_shapes(tmp_path: Path) -> None:
    received = on_ranks(tmp_path, exchanged)
    for me in range(2):
        for sender in range(2):
            torch.testing.assert_close(received[me][sender], torch.full((sender + me + 1, 2), 10.0 * sender + me))


def layout_groups() -> dict:
    def members(name: str) -> list[int]:
        return dist.get_process_group_ranks(ddpw_runtime.group(name))

    total = torch.tensor([float(ddpw_runtime.rank())])
    dist.all_reduce(total, group=ddpw_runtime.group("tensor"))
    return {
        "pipeline": members("pipeline"),
        "data": members("data"),
        "tensor": members("tensor"),
        "tensor_sum": total.item(),
        "mesh": ddpw_runtime.mesh().mesh_dim_names,
    }


def test_layout_builds_named_groups_on_a_device_mesh(tmp_path: Path) -> None:
    seen = on_ranks(tmp_path, layout_groups, n=4, layout={"pipeline": 2, "tensor": 2})
    assert [s["tensor"] for s in seen] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [s["pipeline"] for s in seen] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [s["data"] for s in seen] == [[0], [1], [2], [3]]
    assert [s["tensor_sum"] for s in seen] == [1.0, 1.0, 5.0, 5.0]
    assert seen[0]["mesh"] == ("pipeline", "data", "tensor")


def default_layout_groups() -> dict:
    errors: list[str] = []
    for ask in (lambda: ddpw_runtime.group("tensor"), ddpw_runtime.mesh, lambda: ddpw_runtime.group("expert")):
        try:
            ask()
        except (ValueError, RuntimeError) as exc:
            errors.append(str(exc))
    return {"data_is_world": ddpw_runtime.group("data") is dist.group.WORLD, "errors": errors}


def test_default_layout_is_all_data_parallel(tmp_path: Path) -> None:
    seen = on_ranks(tmp_path, default_layout_groups)[0]
    assert seen["data_is_world"]
    tensor, mesh, unknown = seen["errors"]
    assert "platform.layout.tensor is 1" in tensor
    assert "no layout mesh" in mesh
    assert "no group named 'expert'" in unknown


def wrap_before_and_after_the_tasks_own_group() -> tuple[str, bool]:
    try:
        ddpw_runtime.wrap_model(nn.Linear(2, 2))
        before = "no error"
    except RuntimeError as exc:
        before = str(exc)
    dist.init_process_group("gloo")  # (torchrun's variables, which hydra-ddpw set)
    return before, isinstance(ddpw_runtime.wrap_model(nn.Linear(2, 2)), nn.parallel.DistributedDataParallel)


def test_with_ipc_groups_null_a_helper_before_the_tasks_own_group_says_to_make_it(tmp_path: Path) -> None:
    """`platform.ipc_groups=null`: torch's "Default process group has not been initialized" said nothing of it."""
    (before, wrapped), _ = on_ranks(tmp_path, wrap_before_and_after_the_tasks_own_group, ipc_groups=None)
    assert "with platform.ipc_groups=null hydra-ddpw makes none" in before and "init_process_group()" in before
    assert wrapped


@pytest.mark.parametrize(
    "layout, key",
    [
        ({"tensor": 3}, "platform.layout.tensor"),
        ({"data": 3}, "platform.layout.data"),
        ({"pipeline": 0}, "platform.layout.pipeline"),
    ],
)
def test_layout_that_does_not_fit_the_world_is_refused_before_start(layout: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        Wrapper(Platform(n_procs_per_node=4, layout=Layout(**layout)))
    assert info.value.key == key and "platform.layout" in str(info.value)


def ask_rank_in_a_subprocess() -> str:
    import subprocess
    import sys

    code = "import ddpw_runtime\ntry: ddpw_runtime.rank()\nexcept RuntimeError as e: print(e)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_a_helper_in_a_process_the_rank_started_says_it_is_no_rank_and_where_its_rank_is(tmp_path: Path) -> None:
    """A subprocess (or a DataLoader worker of 'spawn') inherits the rank's RANK: the error says so and what to read
    (it said only to call it from the task, which the user's code, started by the task, seemed to do)."""
    said = on_ranks(tmp_path, ask_rank_in_a_subprocess)
    assert "This process has RANK=1 in its environment" in said[1] and "os.environ['RANK']" in said[1], said
