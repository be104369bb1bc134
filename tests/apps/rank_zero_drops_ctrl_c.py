"""Rank 0 in the program's own process (a plain run's, or `Wrapper(caller_rank=True)`'s) gets Ctrl-C as it joins its
job, inside code that drops the KeyboardInterrupt, as code that rank 0's joining runs may (numpy's random module,
imported as rank 0 seeds it: CPython ran the handler inside an ABC's check under the extension's import, which lost
what it raised). Here it is Python's `random.seed`, which the joining calls: in rank 0 it says so (`joining_0` in
`MARKS`), waits for Ctrl-C and drops it. The task says that it ran (`task_ran_<rank>`), then waits for a signal."""

import os
import random
import signal
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

_seed = random.seed


def _seed_dropping_ctrl_c(*args: Any, **kwargs: Any) -> None:
    if os.environ.get("RANK") == "0":  # (set as rank 0 joins its job)
        (Path(os.environ["MARKS"]) / "joining_0").touch()
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    _seed(*args, **kwargs)


random.seed = _seed_dropping_ctrl_c


def task() -> None:
    """Say that the task ran, then wait for a signal."""
    (Path(os.environ["MARKS"]) / f"task_ran_{os.environ['RANK']}").touch()
    while True:
        signal.pause()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    task()


if __name__ == "__main__":
    main()
