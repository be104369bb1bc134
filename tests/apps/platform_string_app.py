"""An app whose config has `platform: linux-x86_64`, unrelated to hydra-ddpw; each rank reports the
world it is in and the app's own `platform`."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime


@hydra.main(version_base=None, config_path="conf", config_name="platform_string")
def main(cfg: DictConfig) -> str:
    rank = ddpw_runtime.rank()
    seen = {"rank": rank, "world_size": ddpw_runtime.world_size(), "platform": cfg.platform}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    return str(cfg.platform)


if __name__ == "__main__":
    main()
