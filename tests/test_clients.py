"""Lightning, accelerate and a torchrun-style script inside ddpw's ranks: the training code of
`examples/lightning_train.py`, `accelerate_train.py` and `torchrun_style.py`, run by the launcher on 2
CPU ranks (`tests/apps/*_app.py`), each rank reporting what the library saw."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ddpw_runtime import Platform, Wrapper
from tests.helpers import job_dirs, leftover, run_app, seen

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes


def run_client(tmp_path: Path, app: str, epochs: int) -> dict[int, dict]:
    """Run `app` (a plain run: one job, 2 ranks, examples/conf/config.yaml) and return what each rank
    reported, after checking the launch: rank 0 is the program itself, whose only child is the rank
    starter; the starter's only child is rank 1; rank 1 started no process of its own, so the library
    launched nothing more."""
    proc = run_app(tmp_path, f"epochs={epochs}", app=app)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    starter = ranks[1]["ppid"]
    assert ranks[0]["children"] == [starter], ranks[0]
    assert ranks[1]["siblings"] == [ranks[1]["pid"]] and ranks[1]["children"] == [], ranks[1]
    for data in ranks.values():
        assert data["world_size"] == 2
    assert sorted(p.name for p in job.glob("rank_*.log")) == ["rank_0.log", "rank_1.log"]
    assert leftover(ranks) == []
    return ranks


def test_lightning_trainer_joins_the_launched_ranks(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "lightning_app.py", epochs=2)
    for rank, data in ranks.items():
        assert data["cluster_environment"] == "TorchElasticEnvironment"  # found a launched job
        assert data["strategy"] == "DDPStrategy"
        assert data["lightning_world_size"] == 2 and data["num_devices"] == 2
        assert data["lightning_global_rank"] == rank and data["lightning_local_rank"] == rank
        assert data["same_process_group"]  # ddpw's group, not a second one
        assert data["rank_zero_only_before_trainer"] == rank  # right before any Trainer exists
        assert data["global_step"] == 2 * 23  # 2 epochs of 1437 samples / 2 ranks / batch 32
        assert data["weights_equal_on_every_rank"]  # DDP kept the replicas in step
        assert data["accuracy"] > 0.5
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]


def test_accelerate_sees_every_rank_and_gathers(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "accelerate_app.py", epochs=1)
    for rank, data in ranks.items():
        assert data["distributed_type"] == "DistributedType.MULTI_CPU"
        assert data["num_processes"] == 2
        assert data["process_index"] == rank and data["local_process_index"] == rank
        assert data["is_main_process"] == (rank == 0)
        assert data["gathered"] == [1, 11]  # every rank's tensor, in rank order
        assert data["accuracy"] > 0.5
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]  # gather_for_metrics: all of the validation set


def test_torchrun_style_script_assumptions_hold(tmp_path: Path) -> None:
    ranks = run_client(tmp_path, "torchrun_app.py", epochs=1)
    ports = {data["env"]["MASTER_PORT"] for data in ranks.values()}
    run_ids = {data["env"]["TORCHELASTIC_RUN_ID"] for data in ranks.values()}
    assert len(ports) == 1 and len(run_ids) == 1 and None not in run_ids
    for rank, data in ranks.items():
        env = data["env"]
        assert int(env["RANK"]) == data["dist_rank"] == rank
        assert int(env["LOCAL_RANK"]) == data["local_rank"] == rank
        assert int(env["WORLD_SIZE"]) == data["dist_world_size"] == 2
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
        assert env["ROLE_RANK"] == str(rank) and env["ROLE_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        # The group exists already: an unguarded call is refused by torch, as documented (torch 2.13:
        # "ValueError: trying to initialize the default process group twice!"; other versions word it
        # differently).
        assert data["second_init"] != "no error"
        assert data["second_init"].split(":")[0] in ("ValueError", "RuntimeError")
        assert data["accuracy"] > 0.5


def fit_lightning(devices: int | None) -> int:
    """A Lightning fit on 8 random samples; the world size the Trainer saw. `devices=None`: not given
(an explicit value, "auto" included, wins over `PL_TRAINER_DEVICES`)."""
    import lightning as L
    import torch

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    chosen: dict[str, Any] = {} if devices is None else {"devices": devices}
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **chosen)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer.fit(Tiny(), data)
    return int(trainer.world_size)


def test_a_trainer_set_to_one_device_in_a_two_rank_job_gets_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ddpw"):
        sizes = Wrapper(Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path).start(fit_lightning, 1)
    assert sizes == [1, 1]  # each rank trained alone: the trap
    assert caplog.text.count("Lightning ran each rank as a job of its own") == 1  # once, not once per rank
    assert "Trainer(devices=2, num_nodes=1)" in caplog.text


def test_a_trainer_without_devices_follows_the_platform(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ddpw"):
        sizes = Wrapper(Platform(n_procs_per_node=2, verbose=False), log_dir=tmp_path).start(fit_lightning, None)
    assert sizes == [2, 2]  # PL_TRAINER_DEVICES / PL_TRAINER_NUM_NODES follow the platform
    assert "Lightning ran each rank" not in caplog.text
