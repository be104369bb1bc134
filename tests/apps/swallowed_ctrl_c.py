"""A task for `Wrapper(spawn_method="spawn")` whose module, imported by a rank as it sets up, waits there for Ctrl-C
and drops the KeyboardInterrupt it raises, as code that a rank's set-up runs may (an import that catches everything,
a callback from C++). `MARKS` names the folder where it says what it did."""

import os
import signal
from pathlib import Path

if "LOCAL_RANK" in os.environ:  # in a rank, not in the caller that imports the task
    (Path(os.environ["MARKS"]) / f"importing_{os.environ['RANK']}").touch()
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass


def task() -> None:
    """Say that the task ran, then wait for a signal."""
    (Path(os.environ["MARKS"]) / f"task_ran_{os.environ['RANK']}").touch()
    signal.pause()
