"""A research-repo style Hydra app for the tests: each rank reports its environment, Hydra runtime
values and platform. Imports nothing heavy, so `--cfg` and `--info` runs are quick."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime

ENV_KEYS = ("DDPW_TEST_SET", "DDPW_TEST_COPY")


@hydra.main(version_base=None, config_path="conf", config_name="patterns")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    platform = ddpw_runtime.platform()
    seen = {
        "rank": ddpw_runtime.rank(),
        "world_size": ddpw_runtime.world_size(),
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "out_dir": cfg.out_dir,
        "job_name": cfg.job_name,
        "hydra_output_dir": hydra_cfg.runtime.output_dir,
        "platform_choice": hydra_cfg.runtime.choices.get("platform"),
        "platform_name": platform.name,
        "threads": int(os.environ["OMP_NUM_THREADS"]),
    }
    with open(os.path.join(hydra_cfg.runtime.output_dir, f"seen_rank_{seen['rank']}.json"), "w") as out:
        json.dump(seen, out)
    ddpw_runtime.barrier()


if __name__ == "__main__":
    main()
