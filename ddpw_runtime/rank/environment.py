"""A rank's environment: torchrun's variables, and what training libraries need beyond them: `ACCELERATE_USE_CPU` on
CPU (else `Accelerator()` runs each rank alone), `PL_TRAINER_DEVICES`/`PL_TRAINER_NUM_NODES` (so a bare `Trainer()`
joins every rank), and Lightning's `rank_zero_only.rank`, read once at import (a fork would keep its 0). No torch."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ddpw_runtime.launch.plan import RECORDER_PREFIX, THREADS_ENV, LaunchPlan, threads_set_in

RESTART_COUNT_ENV = "DDPW_RESTART_COUNT"
"""The variable that carries `restart_count()` to the ranks."""
RECORDED_COLLECTIVES = 2000
"""How many last collectives a rank's flight recorder keeps (`TORCH_FR_BUFFER_SIZE` unless set): cheap."""


def rank_environment(plan: LaunchPlan, rank: int, local_rank: int, given: Mapping[str, str]) -> dict[str, str]:
    """The variables of `rank` to add to `given`, the launching process's environment (a library variable or
    `OMP_NUM_THREADS` set there is left alone, as torchrun does): a job beside others sees only its own GPUs, a
    single-node loopback job keeps gloo and NCCL on loopback, NCCL dumps the flight recorder on a timeout."""
    local_only = plan.platform.n_nodes == 1 and plan.master_addr.startswith("127.") and sys.platform == "linux"
    defaults = {name: "lo" for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if local_only}
    defaults["PL_TRAINER_DEVICES"] = str(plan.ranks_per_node)
    defaults["PL_TRAINER_NUM_NODES"] = str(plan.platform.n_nodes)
    if plan.device == "cpu":
        defaults["ACCELERATE_USE_CPU"] = "true"
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in given:  # its older name
        defaults["TORCH_FR_BUFFER_SIZE"] = str(RECORDED_COLLECTIVES)
    defaults["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    defaults["TORCH_FR_DUMP_TEMP_FILE"] = str(plan.log_dir / RECORDER_PREFIX)
    defaults[THREADS_ENV] = str(plan.threads_per_rank)
    restarts = str(plan.restart_count)
    own_gpus = {} if plan.share is None or plan.share.gpus is None else {
        "CUDA_VISIBLE_DEVICES": ",".join(plan.share.gpus)}  # rank k binds cuda:k, the k-th of its job's GPUs
    return {
        **{name: value for name, value in defaults.items() if name not in given},
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.ranks_per_node),
        "GROUP_RANK": str(plan.node_rank),
        "NODE_RANK": str(plan.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "ROLE_NAME": "default",
        "GROUP_WORLD_SIZE": str(plan.platform.n_nodes),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "TORCHELASTIC_RUN_ID": plan.run_id,
        "TORCHELASTIC_RESTART_COUNT": restarts,
        "TORCHELASTIC_MAX_RESTARTS": str(plan.max_restarts),
        # torchrun's word that the job's store is hosted already (by its agent; here by the process that supervises
        # node 0's ranks): env:// and the job's tcp:// then make every rank a client of it, as under torchrun.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        RESTART_COUNT_ENV: restarts,
        **own_gpus,
    }


def threads_per_rank(plan: LaunchPlan) -> int:
    """The threads this rank's torch uses: `OMP_NUM_THREADS` when it is a count, else the plan's split."""
    return threads_set_in(os.environ) or plan.threads_per_rank


def tell_imported_libraries(rank: int) -> None:
    """Give `rank` to libraries imported before this process became a rank that read it only at import (Lightning's
    `rank_zero_only.rank`, shared by lightning, pytorch_lightning and lightning_fabric)."""
    rank_zero = sys.modules.get("lightning_utilities.core.rank_zero")
    decorator = getattr(rank_zero, "rank_zero_only", None)
    if decorator is not None and hasattr(decorator, "rank"):
        decorator.rank = rank
