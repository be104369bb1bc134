"""examples/torchrun_style.py's `fit`, run by the ddpw launcher; each rank reports what a torchrun
script relies on, and what its own `init_process_group()` does (before `fit` makes its own call too)."""

import os
import sys

import hydra
import torch.distributed as dist
from client_report import EXAMPLES, save
from omegaconf import DictConfig

import ddpw_runtime

sys.path.insert(0, str(EXAMPLES))
import torchrun_style  # noqa: E402 - the example under test

TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@hydra.main(version_base=None, config_path=str(EXAMPLES / "conf"), config_name="config")
def main(cfg: DictConfig) -> float:
    try:
        dist.init_process_group()
        own_init = "no error"
    except Exception as error:  # noqa: BLE001 - recorded
        own_init = f"{type(error).__name__}: {error}"
    accuracy = torchrun_style.fit(cfg)
    save({
        "env": {key: os.environ.get(key) for key in TORCHRUN_KEYS},
        "dist_rank": dist.get_rank(),
        "dist_world_size": dist.get_world_size(),
        "local_rank": ddpw_runtime.local_rank(),
        "own_init": own_init,
        "accuracy": accuracy,
    })
    return accuracy


if __name__ == "__main__":
    main()
