"""What training libraries need in a rank beyond torchrun's variables.

- Hugging Face accelerate counts CPU processes as one distributed job only when its launcher says so
  (`accelerate launch --cpu` sets `ACCELERATE_USE_CPU`); without it, `Accelerator()` on a machine with no
  GPU runs each rank as a separate single process.
- Lightning reads the rank from the environment once, when it is imported (`rank_zero_only.rank`). A
  rank forked from a controller that had imported Lightning would keep the controller's value, 0, so
  `@rank_zero_only` code would run on every rank until a Trainer sets the rank.
"""

from __future__ import annotations

import os
import sys
from typing import Dict

_ACCELERATE_CPU = "ACCELERATE_USE_CPU"
_LIGHTNING_RANK_ZERO = "lightning_utilities.core.rank_zero"


def library_environment(device: str) -> Dict[str, str]:
    """Variables for the ranks of a job on `device` (a torch device type), as the libraries' own
    launchers set them; a variable the user set is left alone."""
    if device == "cpu" and _ACCELERATE_CPU not in os.environ:
        return {_ACCELERATE_CPU: "true"}
    return {}


def tell_imported_libraries(rank: int) -> None:
    """Give `rank` to libraries that were imported before this process became a rank and read the
    rank only at import time (Lightning's `rank_zero_only.rank`, shared by lightning, pytorch_lightning
    and lightning_fabric)."""
    rank_zero = sys.modules.get(_LIGHTNING_RANK_ZERO)
    decorator = getattr(rank_zero, "rank_zero_only", None)
    if decorator is not None and hasattr(decorator, "rank"):
        decorator.rank = rank
