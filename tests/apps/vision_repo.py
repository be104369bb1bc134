"""A vision-research repo in the style of torchvision's `references/` (DeiT, MAE, DETR): `main(args)` takes argparse
args (here made from the Hydra config), `init_distributed_mode(args)` reads the rank from the environment, makes the
group with the rank and world size it read, and replaces `print` so that only rank 0 prints (unless `force=True`);
a `MetricLogger` all-reduces its meters, a `DistributedSampler` is set to each epoch, and rank 0 saves.
`slurm_first=true`: the SLURM branch comes first, as in some forks."""

import argparse
import builtins
import json
import os
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup_for_distributed(is_master: bool) -> None:
    builtin_print = builtins.print

    def print(*args: Any, **kwargs: Any) -> None:  # noqa: A001 - the repo's own print
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args: argparse.Namespace) -> None:
    if args.slurm_first and "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.world_size = int(os.environ["SLURM_NTASKS"])
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return
    args.distributed = True
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(backend="gloo", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def save_on_master(*args: Any, **kwargs: Any) -> None:
    if is_main_process():
        torch.save(*args, **kwargs)


class MetricLogger:
    """The meters' count and total, all-reduced at the end of an epoch (`synchronize_between_processes`)."""

    def __init__(self) -> None:
        self.meters: dict[str, list[float]] = {}

    def update(self, **values: float) -> None:
        for name, value in values.items():
            count_total = self.meters.setdefault(name, [0.0, 0.0])
            count_total[0] += 1
            count_total[1] += value

    def synchronize_between_processes(self) -> None:
        for count_total in self.meters.values():
            t = torch.tensor(count_total, dtype=torch.float64)
            dist.barrier()
            dist.all_reduce(t)
            count_total[:] = t.tolist()

    def global_avg(self) -> dict[str, float]:
        return {name: total / count for name, (count, total) in self.meters.items()}


def main(args: argparse.Namespace) -> float:
    init_distributed_mode(args)
    print(args)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(args.seed)
    model_without_ddp = nn.Linear(4, 3)
    sampler: DistributedSampler[Any] = DistributedSampler(data, shuffle=True, seed=args.seed)
    model = nn.parallel.DistributedDataParallel(model_without_ddp)
    loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        logger = MetricLogger()
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            logger.update(loss=loss.item())
            print(f"Epoch: [{epoch}] loss {loss.item():.4f}")
        logger.synchronize_between_processes()
        stats = logger.global_avg()
        print("Averaged stats:", stats)
        print(f"rank {dist.get_rank()} done with epoch {epoch}", force=True)  # type: ignore[call-overload]
        if is_main_process():
            with open(Path(args.output_dir) / "log.txt", "a") as log:
                log.write(json.dumps({"epoch": epoch, **stats}) + "\n")
        save_on_master({"model": model_without_ddp.state_dict()}, Path(args.output_dir) / "checkpoint.pth")
    return stats["loss"]


@hydra.main(version_base=None, config_path="conf", config_name="vision_repo")
def hydra_main(cfg: DictConfig) -> float:
    config: dict[str, Any] = OmegaConf.to_container(cfg)  # type: ignore[assignment]
    args = argparse.Namespace(**config, output_dir=HydraConfig.get().runtime.output_dir)
    return main(args)


if __name__ == "__main__":
    hydra_main()
