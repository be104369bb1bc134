"""A multirun whose sweep's process (the one that runs Hydra's sweep) gets Ctrl-C inside code that drops what the
handler raised: a garbage collector's callback (CPython drops what one raises, as it drops what a weakref callback
raises, such as importlib's as an import ends). `DropsCtrlC` (named in `hydra.callbacks`) makes the sweep's process
collect its garbage when it gets SIGUSR2, with a callback that says so (`waiting` in `MARKS`) and waits for Ctrl-C.
Every rank's task says it runs (`in_task_<rank>`), then waits for a signal."""

import gc
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class DropsCtrlC(Callback):
    """See the module docstring."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        waiting = Path(os.environ["MARKS"]) / "waiting"

        def wait_for_ctrl_c(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                waiting.touch()
                signal.pause()

        def collect(signum: int, frame: FrameType | None) -> None:
            gc.callbacks.append(wait_for_ctrl_c)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(wait_for_ctrl_c)

        signal.signal(signal.SIGUSR2, collect)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    (Path(os.environ["MARKS"]) / f"in_task_{os.environ['RANK']}").touch()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
