"""A package whose import, on a job's first attempt, is where rank 0 gets the job's stop: it imports a submodule, meets
the other ranks (whose rank `fail_rank` then fails), and ends once the stop's signal has come, inside this import."""

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import cast

import torch.distributed as dist

import ddpw_runtime
from ddpw_runtime.launch.supervisor import STOP_SIGNAL

from .part import VALUE

if ddpw_runtime.restart_count() == 0:
    came = threading.Event()
    stop = cast(Callable[[int, FrameType | None], None], signal.getsignal(STOP_SIGNAL))  # (plain_run's `_on_stop`)

    def note_then_stop(signum: int, frame: FrameType | None) -> None:
        came.set()
        stop(signum, frame)

    signal.signal(STOP_SIGNAL, note_then_stop)
    dist.barrier()
    while not came.is_set():
        time.sleep(0.01)
    signal.signal(STOP_SIGNAL, stop)

__all__ = ["VALUE"]
