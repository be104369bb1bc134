"""A sweep for the resume tests: 1-rank jobs that note each run in a shared folder (`runs`), one job
that fails once, and one that holds while a file says so (a test kills the sweep meanwhile)."""

import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="resume")
def main(cfg: DictConfig) -> float:
    job = HydraConfig.get().job.num
    runs = Path(cfg.runs)
    with open(runs / f"ran_{job}", "a") as out:  # one line per run of this job
        out.write(f"{os.getpid()} {HydraConfig.get().runtime.output_dir}\n")
    if job == cfg.fail_once and not (runs / "failed_once").exists():
        (runs / "failed_once").touch()
        raise ValueError(f"job {job} fails once")
    if job == cfg.hold:
        (runs / f"holding_{job}").write_text(str(os.getpid()))
        while (runs / "hold").exists():
            time.sleep(0.05)
    return cfg.x * 10.0 + 0.5


if __name__ == "__main__":
    main()
