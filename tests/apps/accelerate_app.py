"""examples/accelerate_train.py's `fit`, run by the ddpw launcher; each rank reports what accelerate saw."""

import sys

import hydra
import torch
from client_report import EXAMPLES, save
from omegaconf import DictConfig

sys.path.insert(0, str(EXAMPLES))
import accelerate_train  # noqa: E402 - the example under test


@hydra.main(version_base=None, config_path=str(EXAMPLES / "conf"), config_name="config")
def main(cfg: DictConfig) -> float:
    accelerator, accuracy = accelerate_train.fit(cfg)
    gathered = accelerator.gather(torch.tensor([accelerator.process_index * 10 + 1], device=accelerator.device))
    save({
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "distributed_type": str(accelerator.distributed_type),
        "is_main_process": accelerator.is_main_process,
        "mixed_precision": accelerator.mixed_precision,
        "gathered": gathered.tolist(),
        "accuracy": accuracy,
    })
    return accuracy


if __name__ == "__main__":
    main()
