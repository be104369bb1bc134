"""hydra-ddpw's Wrapper API, no Hydra: `python wrapper_app.py N [MODE] [caller]`; with `caller`, rank 0 runs
in this process (`Wrapper(..., caller_rank=True)`)."""

import sys

import rank_work
import torch  # noqa: F401 - imported at the top, as a training script does

from ddpw_runtime import Platform, Wrapper

if __name__ == "__main__":
    n = int(sys.argv[1])
    caller_rank = sys.argv[3:] == ["caller"]
    Wrapper(Platform(n_procs_per_node=n), caller_rank=caller_rank).start(
        rank_work.run, sys.argv[2] if len(sys.argv) > 2 else "trivial")
