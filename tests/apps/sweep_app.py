"""A sweep objective for the tests: rank 0 returns (x - 1)^2, every other rank a value that would win
if a sweeper read it; each rank reports what it saw."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime

DECOY = -1000.0
"""What ranks other than 0 return: the best objective there could be, so using it shows."""


@hydra.main(version_base=None, config_path="conf", config_name="optuna")
def main(cfg: DictConfig) -> float:
    rank = ddpw_runtime.rank()
    value = (cfg.x - 1.0) ** 2 if rank == 0 else DECOY
    seen = {"rank": rank, "world_size": ddpw_runtime.world_size(), "x": cfg.x, "value": value,
            "job_num": HydraConfig.get().job.num, "pid": os.getpid()}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    ddpw_runtime.barrier()
    return value


if __name__ == "__main__":
    main()
