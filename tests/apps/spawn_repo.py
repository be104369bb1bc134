"""A Hydra script that starts its own ranks with `torch.multiprocessing.spawn`, as many research repos do: `ddp_main`
makes a group of `cfg.n_procs` ranks of its own and sums the ranks over it. With `+recipe=true` it takes the change
docs/from-torchrun.md gives (call `ddp_main` in the rank where a launcher started it, and leave `MASTER_ADDR` and
`MASTER_PORT` to the launcher) and reports what it saw; with `+recipe=ranks_only`, only its first half (it still sets
`MASTER_ADDR` and `MASTER_PORT`)."""

import json
import os

import hydra
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def ddp_main(rank: int, cfg: DictConfig, out_dir: str) -> None:
    if cfg.get("recipe") is not True:  # as the tutorials do; the change leaves them to the launcher
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(cfg.get("port", 29533))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.n_procs)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    seen = {"rank": rank, "world_size": dist.get_world_size(), "total": total.item(), "pid": os.getpid(),
            "ppid": os.getppid()}
    with open(os.path.join(out_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    dist.destroy_process_group()


@hydra.main(version_base=None, config_path="conf", config_name="torchrun")
def main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    if cfg.get("recipe") and "LOCAL_RANK" in os.environ:
        ddp_main(int(os.environ["LOCAL_RANK"]), cfg, out_dir)
    else:
        mp.spawn(ddp_main, args=(cfg, out_dir), nprocs=cfg.n_procs)


if __name__ == "__main__":
    main()
