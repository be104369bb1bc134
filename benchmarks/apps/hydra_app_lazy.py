"""The benchmark's Hydra app with torch imported only inside the task, so the Hydra process (the
controller) never imports it: shows what the launcher itself costs the controller."""

import hydra
import rank_work
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> float:
    """Every rank: the work of `cfg.mode` (rank_work imports torch when it runs)."""
    marks = rank_work.run(cfg.mode, tag=f"job{cfg.job}", fail_rank=cfg.fail_rank)
    return marks["done"] - marks["entry"]


if __name__ == "__main__":
    main()
