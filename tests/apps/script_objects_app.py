"""A Hydra app whose task uses the script's own class the way training code does: a Dataset class of the
script, read by a DataLoader whose worker starts with spawn (the usual choice with CUDA, the default on
macOS), and a failure raised on a line of the script. `--config-name slurm` runs it on SLURM."""

import json
import os
import sys

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

import ddpw_runtime


class Squares(Dataset):
    """0, 1, 4, 9."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(float(index * index))


class DataError(ValueError):
    """An error class of the script's own."""


def fail_here() -> None:
    raise DataError("failed on a line of the script")


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    rank = ddpw_runtime.rank()
    if cfg.behaviour == "raise" and rank == cfg.fail_rank:
        fail_here()
    loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    total = torch.stack([batch.sum() for batch in loader]).sum()
    dist.all_reduce(total)
    script = sys.modules["__main__"]
    seen = {
        "rank": rank,
        "total": total.item(),
        "same_class": script.Squares is Squares,
        "same_task": script.main.__wrapped__ is main_task,
    }
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    return total.item()


main_task = main.__wrapped__

if __name__ == "__main__":
    main()
