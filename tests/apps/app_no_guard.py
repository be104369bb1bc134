"""A Hydra app without the `if __name__ == "__main__":` guard: its ranks must not run it again."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    rank = ddpw_runtime.rank()
    path = os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json")
    with open(path, "w") as out:
        json.dump({"rank": rank, "pid": os.getpid(), "ppid": os.getppid()}, out)


main()
