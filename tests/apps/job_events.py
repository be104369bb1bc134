"""Hydra callbacks of the test apps: one logs a line in `on_job_start` and `on_job_end` into the job's own log, as
experiment trackers' callbacks do; one exits in `on_job_end`."""

import logging
import sys
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger("job_events")


class LogsJobEvents(Callback):
    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        log.info("on_job_start of job %s", config.job)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        log.info("on_job_end of job %s", config.job)


class ExitsAtJobEnd(Callback):
    """`sys.exit(3)` in `on_job_end`: an error outside the task, which ends the sweep as Hydra's own launcher ends."""

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        sys.exit(3)
