"""For the side-by-side app: a Hydra callback that logs a line in `on_job_start` and `on_job_end`, as
experiment trackers' callbacks do, into the job's own log."""

import logging
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger("job_events")


class LogsJobEvents(Callback):
    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        log.info("on_job_start of job %s", config.job)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        log.info("on_job_end of job %s", config.job)
