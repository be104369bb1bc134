"""The GPU path: device binding per local rank, nccl, `ddpw_gpu`. Skipped where no CUDA GPU exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpw_conf import ConfigError, Platform
from ddpw_runtime.launch.checks import check
from ddpw_runtime.launch.devices import visible_gpus
from tests.helpers import run_app, run_ranks

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), pytest.mark.subprocess]
EXAMPLE = Path(__file__).parent.parent / "examples" / "train.py"


def what_the_rank_sees() -> dict:
    import torch.distributed as dist

    import ddpw_runtime

    value = torch.ones(1, device=ddpw_runtime.device()) * (ddpw_runtime.rank() + 1)
    dist.all_reduce(value)
    return {
        "backend": dist.get_backend(),
        "device": str(ddpw_runtime.device()),
        "current": torch.cuda.current_device(),
        "sum": value.item(),
    }


def test_each_rank_is_bound_to_its_gpu_and_uses_nccl(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    values = run_ranks(what_the_rank_sees, platform=Platform(device="gpu", n_gpus_per_node=n), log_dir=tmp_path)
    assert [v["device"] for v in values] == [f"cuda:{k}" for k in range(n)]
    assert [v["current"] for v in values] == list(range(n))
    assert {v["backend"] for v in values} == {"nccl"}
    assert {v["sum"] for v in values} == {n * (n + 1) / 2}


def test_gloo_on_gpu_ranks_works_too(tmp_path: Path) -> None:
    (value,) = run_ranks(what_the_rank_sees, platform=Platform(device="gpu", n_gpus_per_node=1, backend="gloo"),
                         log_dir=tmp_path)
    assert value["backend"] == "gloo" and value["device"] == "cuda:0"


def test_more_gpus_than_present_is_refused() -> None:
    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ConfigError, match="platform.n_gpus_per_node"):
        check(Platform(device="gpu", n_gpus_per_node=too_many))


def test_the_example_trains_with_ddpw_gpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "hydra/launcher=ddpw_gpu", "platform.n_gpus_per_node=1", "epochs=5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "val_acc" in proc.stdout + proc.stderr


def test_gpu_jobs_of_a_sweep_run_side_by_side_on_gpus_of_their_own(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    meet = tmp_path / "meet"
    meet.mkdir()
    # n + 1 one-GPU jobs: the first n wait until all n run at once; the last starts when a GPU is free
    proc = run_app(tmp_path, "-m", "hydra/launcher=ddpw_gpu", "platform.n_gpus_per_node=1",
                   "platform.n_cpus_per_node=null", f"job={','.join(str(k) for k in range(n + 1))}",
                   f"together={n}", f"meet={meet}", "hydra.sweep.dir=sw", app="side_by_side_app.py")
    assert proc.returncode == 0, proc.stderr
    seen = {int(p.name.split("_")[1]): p.read_text() for p in meet.glob("started_*")}
    gpus = [json.loads(seen[k])["gpus"] for k in range(n + 1)]
    assert sorted(gpus[:n]) == sorted(visible_gpus(n)) and gpus[n] in visible_gpus(n)


def _all_reduce_and_dump() -> None:
    import torch.distributed as dist

    import ddpw_runtime
    from ddpw_runtime.rank import recorder

    dist.all_reduce(torch.ones(1, device=ddpw_runtime.device()))
    torch.cuda.synchronize()
    recorder.dump()  # as when the supervisor takes the rank's stacks


def test_an_nccl_groups_flight_recorder_is_dumped_and_read(tmp_path: Path) -> None:
    from ddpw_runtime.launch.recorded import recorded_in

    run_ranks(_all_reduce_and_dump, platform=Platform(device="gpu", n_gpus_per_node=1), log_dir=tmp_path)
    (recorded,) = recorded_in(tmp_path, [0])
    assert recorded.newest is not None and recorded.newest.name == "all_reduce", recorded


def _held_up_by_rank_1_on_nccl() -> None:
    import time

    import torch.distributed as dist

    import ddpw_runtime

    if ddpw_runtime.rank() == 1:
        while True:
            time.sleep(1)
    dist.all_reduce(torch.ones(1, device=ddpw_runtime.device()))
    dist.barrier()  # waits in torch.distributed until NCCL's watchdog times the collective out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs")
def test_an_nccl_hang_names_the_missing_ranks_collective_from_its_flight_recorder(tmp_path: Path) -> None:
    from ddpw_runtime import RankFailure

    with pytest.raises(RankFailure) as info:
        run_ranks(_held_up_by_rank_1_on_nccl, log_dir=tmp_path,
                  platform=Platform(device="gpu", n_gpus_per_node=2, collective_timeout_min=0.05))
    failure = info.value
    assert (failure.rank, failure.error_type) == (1, "NotInCollective"), failure
    assert failure.hang is not None and failure.hang.awaited is not None, failure
    assert (tmp_path / "fr_rank_0").stat().st_size > 0  # NCCL's own dump on its timeout, in the output dir
    assert f", not {failure.hang.awaited}" in failure.hang.lines()[0]  # rank 1's line: the collective it missed
