"""A plain distributed script for torchrun (no Hydra): `torchrun --nproc_per_node=N plain_script.py [MODE [TAG]]`."""

import sys

import rank_work
import torch  # noqa: F401 - imported at the top, as a training script does

if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "trivial"
    rank_work.run(mode, tag=sys.argv[2] if len(sys.argv) > 2 else "job0")
