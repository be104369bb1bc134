"""For the client-library test apps: what a rank sees of its processes, written next to its log."""

import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig

import ddpw_runtime

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (every thread's children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return sorted(found)


def save(facts: dict[str, Any]) -> None:
    """Write `facts` and this rank's process facts to `seen_rank_<k>.json` in the job's output dir. Ends
    with a barrier, so every rank is still alive while the others look at their processes."""
    rank = ddpw_runtime.rank()
    seen = {
        "rank": rank,
        "world_size": ddpw_runtime.world_size(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "children": children(os.getpid()),
        "siblings": children(os.getppid()),
        **facts,
    }
    path = Path(HydraConfig.get().runtime.output_dir) / f"seen_rank_{rank}.json"
    path.write_text(json.dumps(seen))
    dist.barrier()
