"""Jobs of a sweep that meet in a shared folder (`meet`): each says it started (pid, cores, GPUs, the
jobs that had ended and those still running then) and waits until `together` jobs have started; job
`fail_job` then fails, and `behaviour=block` makes every job wait for a signal. A job that returns says
it ended. Rank 0 returns what it saw. `behaviour=linger`: each other job's rank waits for a signal as it
exits (an atexit handler: a tracker's upload), and job `fail_job` fails once all of them do."""

import atexit
import json
import logging
import os
import threading
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

log = logging.getLogger(__name__)

MEET_TIMEOUT_S = 60.0
"""How long a job waits for the other one before it gives up (a failure, never a pass)."""


def jobs_that(meet: Path, event: str) -> list[int]:
    """The jobs that said `event` ("started", "ended") in `meet`."""
    return sorted(int(p.name.split("_")[1]) for p in meet.glob(f"{event}_*"))


def linger(mark: Path) -> None:
    """As the rank exits: say so, then wait for a signal."""
    mark.touch()
    threading.Event().wait()


@hydra.main(version_base=None, config_path="conf", config_name="side_by_side")
def main(cfg: DictConfig) -> dict:
    started = time.time()
    meet = Path(cfg.meet)
    ended = jobs_that(meet, "ended")
    running = sorted(set(jobs_that(meet, "started")) - set(ended))
    seen = {"job": cfg.job, "pid": os.getpid(), "cores": sorted(os.sched_getaffinity(0)),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "threads": os.environ.get("OMP_NUM_THREADS"),
            "ended_before": ended, "running_beside": running}
    tmp = meet / f".started_{cfg.job}"
    tmp.write_text(json.dumps(seen))
    tmp.rename(meet / f"started_{cfg.job}")
    log.info("job %s logs to its own log", cfg.job)
    print(f"job {cfg.job} prints", flush=True)
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while len(jobs_that(meet, "started")) < cfg.together:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {cfg.job} never saw {cfg.together} jobs running at once")
        time.sleep(0.01)
    if cfg.behaviour == "linger" and cfg.job != cfg.fail_job:
        atexit.register(linger, meet / f"lingering_{cfg.job}")
    last = cfg.behaviour == "linger" and cfg.job == cfg.fail_job
    while last and len(jobs_that(meet, "lingering")) < cfg.together - 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {cfg.job} never saw the other jobs lingering as they exit")
        time.sleep(0.01)
    if cfg.job == cfg.fail_job:
        raise ValueError(f"job {cfg.job} asked to fail")
    if cfg.behaviour == "block":
        threading.Event().wait()
    (meet / f"ended_{cfg.job}").touch()
    return {**seen, "started": started, "ended": time.time()}


if __name__ == "__main__":
    main()
