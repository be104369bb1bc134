"""For the repo app: a Hydra callback that records every callback it gets (with the task function's name
and the job's return value) in `callback_events.jsonl`, where the app started; and a custom logging handler."""

import json
import logging
import os
from typing import Any

from hydra.experimental.callback import Callback


class Recorder(Callback):
    def __init__(self) -> None:
        self.path = os.path.join(os.getcwd(), "callback_events.jsonl")

    def _record(self, event: str, **details: Any) -> None:
        with open(self.path, "a") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **details}) + "\n")

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._record("on_run_start")

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        job_return = kwargs.get("job_return")
        if job_return is None:
            self._record("on_run_end")
            return
        value = job_return._return_value
        self._record("on_run_end", status=job_return.status.name,
                     return_value=value if isinstance(value, (dict, int, str, type(None))) else repr(value))

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._record("on_multirun_start")

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self._record("on_multirun_end")

    def on_job_start(self, config: Any, *, task_function: Any, **kwargs: Any) -> None:
        self._record("on_job_start", task_function=getattr(task_function, "__name__", repr(task_function)))

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        value = job_return._return_value
        self._record("on_job_end", status=job_return.status.name,
                     return_value=value if isinstance(value, (dict, int, str, type(None))) else repr(value))


class LinesHandler(logging.Handler):
    """A custom logging handler that appends each record to `filename` (not a `logging.FileHandler`)."""

    def __init__(self, filename: str) -> None:
        super().__init__()
        self.filename = filename

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.filename, "a") as out:
            out.write(self.format(record) + "\n")


class LockedResolver(Callback):
    """Registers a resolver that holds a lock (which cannot be pickled) when the run starts, after
    hydra-ddpw's own `on_run_start`: the job cannot take the program's Hydra state into its ranks."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        import threading

        from omegaconf import OmegaConf

        lock = threading.Lock()
        OmegaConf.register_new_resolver("locked", lambda: str(lock))
