"""A Hydra app for the Ctrl-C sweep: it says on stderr when its imports are done (a Ctrl-C that lands inside
`import torch` may be swallowed there, with or without hydra-ddpw), then every rank says it is in its task and
waits for a signal."""

import signal
import sys

import hydra
import torch  # noqa: F401  (imported before the line below, as a training script imports it)
from omegaconf import DictConfig

import ddpw_runtime

print("imports done", file=sys.stderr, flush=True)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    print(f"rank {ddpw_runtime.rank()} in its task", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
