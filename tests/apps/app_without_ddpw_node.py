"""A Hydra app whose primary config lacks the `ddpw` node: a ddpw launcher cannot start ranks in run mode."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="without_ddpw_node")
def main(cfg: DictConfig) -> None:
    print("ran as a single process")


if __name__ == "__main__":
    main()
