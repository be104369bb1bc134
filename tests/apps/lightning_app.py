"""examples/lightning_train.py's `fit`, run by the ddpw launcher; each rank reports what Lightning saw."""

import sys

import hydra
import torch
import torch.distributed as dist
from client_report import EXAMPLES, save
from lightning_utilities.core.rank_zero import rank_zero_only
from omegaconf import DictConfig

import ddpw_runtime

sys.path.insert(0, str(EXAMPLES))
import lightning_train  # noqa: E402 - the example under test


@hydra.main(version_base=None, config_path=str(EXAMPLES / "conf"), config_name="config")
def main(cfg: DictConfig) -> float:
    rank_zero_before_trainer = getattr(rank_zero_only, "rank", None)
    group = dist.group.WORLD
    trainer, model, accuracy = lightning_train.fit(cfg)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).to(ddpw_runtime.device())
    gathered = [torch.zeros_like(weights) for _ in range(ddpw_runtime.world_size())]
    dist.all_gather(gathered, weights)
    save({
        "lightning_world_size": trainer.world_size,
        "lightning_global_rank": trainer.global_rank,
        "lightning_local_rank": trainer.local_rank,
        "num_devices": trainer.num_devices,
        "cluster_environment": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
        "strategy": type(trainer.strategy).__name__,
        "same_process_group": dist.group.WORLD is group and dist.is_initialized(),
        "rank_zero_only_before_trainer": rank_zero_before_trainer,
        "global_step": trainer.global_step,
        "weights_equal_on_every_rank": all(torch.equal(weights, other) for other in gathered),
        "accuracy": accuracy,
    })
    return accuracy


if __name__ == "__main__":
    main()
