"""A Hydra app for SIGUSR1/SIGUSR2 given to the program (a SLURM batch script's `trap 'kill -USR1 $pid' USR1`, for a
checkpoint on signal): each rank but `no_handler_rank` handles both, writing `got_<SIGNAME>_rank_<k>` in its job's
output dir (a line per time its handler ran), writes `ready_rank_<k>`, then waits until a file `go` appears in the
working dir and returns."""

import os
import signal
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime


@hydra.main(version_base=None, config_path="conf", config_name="usr_signal")
def main(cfg: DictConfig) -> None:
    rank = ddpw_runtime.rank()
    out = Path(HydraConfig.get().runtime.output_dir)

    def checkpoint(signum: int, frame: object) -> None:
        with open(out / f"got_{signal.Signals(signum).name}_rank_{rank}", "a") as got:
            got.write(f"{os.getpid()}\n")

    if rank != cfg.no_handler_rank:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, checkpoint)
    (out / f"ready_rank_{rank}").write_text(str(os.getpid()))
    while not Path("go").exists():  # (a file the test writes once it saw what it waits for)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
