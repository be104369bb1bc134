"""A Hydra callback whose `on_job_end` never returns and holds Ctrl-C and SIGTERM blocked meanwhile, as a
tracker's network flush or a C call can. It first writes its process's pid to `blocking` in the job's output dir."""

import os
import signal
import threading
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback


class BlocksAtJobEnd(Callback):
    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        path = os.path.join(HydraConfig.get().runtime.output_dir, "blocking")
        with open(path + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        threading.Event().wait()
