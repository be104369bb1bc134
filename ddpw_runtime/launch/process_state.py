"""The launching process's state that every rank takes on (environment, working directory, import path, Hydra's and
OmegaConf's global state), so a rank sees the job as the launcher does. Data only (no torch)."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ddpw_runtime import _compat
from ddpw_runtime.launch import pickling


@dataclass
class ProcessState:
    """What a rank takes on from the process that launched it."""

    env: dict[str, str]
    cwd: str
    sys_path: list[str]
    hydra_state: bytes | None
    """Hydra's and OmegaConf's global state (`pickling.dumps`, `_compat.hydra_state`); None when the launching process
    never loaded OmegaConf (a `Wrapper` script): nothing to take on, and neither side pays for importing Hydra."""

    @staticmethod
    def capture() -> ProcessState:
        """This process's state now."""
        return ProcessState(env=dict(os.environ), cwd=os.getcwd(), sys_path=list(sys.path),
                            hydra_state=pickling.dumps(_compat.hydra_state()) if "omegaconf" in sys.modules else None)

    def enter(self, rank_env: Mapping[str, str]) -> None:
        """Take this state on (environment, working directory, import path, Hydra's), plus the rank's `rank_env`."""
        os.environ.clear()
        os.environ.update(self.env)
        os.environ.update(rank_env)
        os.chdir(self.cwd)
        sys.path[:] = self.sys_path
        if self.hydra_state is not None:
            _compat.restore_hydra_state(pickle.loads(self.hydra_state))
