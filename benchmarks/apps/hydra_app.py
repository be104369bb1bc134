"""The benchmark's Hydra app, written like a real training script: torch is imported at the top.

    python hydra_app.py platform.n_procs_per_node=4            # hydra-ddpw starts 4 ranks
    python hydra_app.py hydra/launcher=basic                   # a plain single-process Hydra run
    torchrun --nproc_per_node=2 hydra_app.py hydra/launcher=basic
"""

import hydra
import rank_work
import torch  # noqa: F401 - imported at the top, as a training script does
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> float:
    """Every rank: the work of `cfg.mode` (see rank_work.py)."""
    marks = rank_work.run(cfg.mode, tag=f"job{cfg.job}", fail_rank=cfg.fail_rank)
    return marks["done"] - marks["entry"]


if __name__ == "__main__":
    main()
