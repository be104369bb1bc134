"""A Hydra script written for torchrun (or torch.distributed.launch), run unchanged: it makes its own
process group with one of the calls such scripts use (`init`), reads `cfg.local_rank`, sums the ranks over
its group, reports what it saw, and destroys the group at the end."""

import json
import os
from collections.abc import Callable

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch.distributed import init_process_group  # bound at import, as many repos do

CALLS: dict[str, Callable[[], None]] = {
    "plain": lambda: dist.init_process_group(),
    "backend": lambda: dist.init_process_group(backend="gloo"),
    "env": lambda: dist.init_process_group(init_method="env://"),
    "bound": lambda: init_process_group(backend="gloo"),
}


@hydra.main(version_base=None, config_path="conf", config_name="torchrun")
def main(cfg: DictConfig) -> float:
    CALLS[cfg.init]()
    rank = dist.get_rank()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    seen = {"rank": rank, "world_size": dist.get_world_size(), "total": total.item(), "local_rank": cfg.local_rank,
            "env_local_rank": int(os.environ["LOCAL_RANK"]), "pid": os.getpid(), "ppid": os.getppid()}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    dist.destroy_process_group()
    return total.item()


if __name__ == "__main__":
    main()
