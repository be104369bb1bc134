"""The launchers under comparison, each as the command a user would type for N ranks.

Every command runs the same rank work (apps/rank_work.py) in a given mode; see apps/ for the scripts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from suite.harness import APPS, python_argv


@dataclass(frozen=True)
class Tool:
    """A way to start N ranks: `argv(n_ranks, mode)` is its command."""

    key: str
    label: str
    argv: Callable[[int, str], list[str]]
    ranks: tuple[int, ...] | None = None
    """The only rank counts it runs at (None: any)."""
    note: str = ""

    def supports(self, n_ranks: int) -> bool:
        """Whether this tool is run with `n_ranks` ranks."""
        return self.ranks is None or n_ranks in self.ranks


def _torchrun(n: int, *script_args: str) -> list[str]:
    # `python -m torch.distributed.run` is what the `torchrun` entry point runs.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *script_args]


HYDRA_DDPW = Tool(
    "hydra_ddpw", "hydra-ddpw (Hydra app)",
    lambda n, mode: python_argv("hydra_app.py", f"platform.n_procs_per_node={n}", f"mode={mode}"),
    note="`python hydra_app.py platform.n_procs_per_node=N`; the app imports torch at the top",
)
HYDRA_DDPW_MULTIRUN = Tool(
    "hydra_ddpw_multirun", "hydra-ddpw multirun (Hydra app)",
    lambda n, mode: python_argv("hydra_app.py", "-m", f"platform.n_procs_per_node={n}", f"mode={mode}"),
    note="`python hydra_app.py -m platform.n_procs_per_node=N`: a one-job multirun; the Hydra process supervises",
)
HYDRA_DDPW_LAZY = Tool(
    "hydra_ddpw_lazy", "hydra-ddpw (Hydra app, torch imported in the task)",
    lambda n, mode: python_argv("hydra_app_lazy.py", f"platform.n_procs_per_node={n}", f"mode={mode}"),
    note="the same app importing torch only inside the task: the controller never imports torch",
)
HYDRA_DDPW_LAZY_MULTIRUN = Tool(
    "hydra_ddpw_lazy_multirun", "hydra-ddpw multirun (Hydra app, torch imported in the task)",
    lambda n, mode: python_argv("hydra_app_lazy.py", "-m", f"platform.n_procs_per_node={n}", f"mode={mode}"),
    note="the lazy app as a one-job multirun (`-m`): the Hydra process only supervises; in a plain run it is rank 0",
)
WRAPPER = Tool(
    "wrapper", "hydra-ddpw Wrapper API",
    lambda n, mode: python_argv("wrapper_app.py", str(n), mode),
    note="`Wrapper(Platform(n_procs_per_node=N)).start(task)` from a script, no Hydra",
)
WRAPPER_CALLER = Tool(
    "wrapper_caller", "hydra-ddpw Wrapper API, caller_rank=True",
    lambda n, mode: python_argv("wrapper_app.py", str(n), mode, "caller"),
    note="`Wrapper(Platform(n_procs_per_node=N), caller_rank=True).start(task)`: rank 0 runs in the calling "
         "process, as ddpw's does with N = 1",
)
TORCHRUN = Tool(
    "torchrun", "torchrun",
    lambda n, mode: _torchrun(n, str(APPS / "plain_script.py"), mode),
    note="`torchrun --standalone --nproc_per_node=N plain_script.py` (no Hydra)",
)
TORCHRUN_HYDRA = Tool(
    "torchrun_hydra", "torchrun + Hydra app",
    lambda n, mode: _torchrun(n, str(APPS / "hydra_app.py"), "hydra/launcher=basic", f"mode={mode}"),
    note="torchrun running the Hydra app in every rank (Hydra composes the config once per rank)",
)
MP_SPAWN = Tool(
    "mp_spawn", "torch.multiprocessing.spawn",
    lambda n, mode: python_argv("mp_spawn_app.py", str(n), mode),
    note="`mp.spawn(fn, nprocs=N)` (start method spawn)",
)
DDPW = Tool(
    "ddpw", "ddpw Wrapper",
    lambda n, mode: python_argv("ddpw_app.py", str(n), mode),
    note="ddpw 5.3 `Wrapper(Platform(device='gpu', n_gpus=N))` with torch.cuda.device_count() "
         "reporting N to ddpw (it runs one process on `device='cpu'`); fork start method, its default. With "
         "N = 1 ddpw starts no process: the task runs in the calling one (hydra-ddpw's like of that is "
         "`Wrapper(..., caller_rank=True)`, the row with caller_rank=True; its default starts the rank in a "
         "process of its own)",
)
DDPW_FORK = Tool(
    "ddpw_fork", "ddpw Wrapper + one fork (the floor of a rank in a process of its own)",
    lambda n, mode: python_argv("ddpw_app.py", str(n), mode, "fork"),
    ranks=(1,),
    note="the ddpw row's command, which first forks a child that exits at once and waits for it: the least any "
         "way of running the one rank in a process of its own adds to ddpw's one-rank job, which runs in the "
         "calling process (a fork leaves that process's memory copy-on-write, and its exit then faults on every "
         "page it writes)",
)
SUBMITIT = Tool(
    "submitit", "hydra-submitit-launcher (local, 2 tasks)",
    lambda n, mode: python_argv("hydra_app.py", "-m", "hydra/launcher=submitit_local",
                                f"hydra.launcher.tasks_per_node={n}", f"mode={mode}"),
    ranks=(2,),
    note="`python hydra_app.py -m hydra/launcher=submitit_local hydra.launcher.tasks_per_node=2`",
)
HYDRA_PLAIN = Tool(
    "hydra_plain", "plain Hydra run, 1 process (floor)",
    lambda n, mode: python_argv("hydra_app.py", "hydra/launcher=basic", f"mode={mode}"),
    ranks=(1,),
    note="`python hydra_app.py hydra/launcher=basic`: one process, a world of one",
)

LAUNCH_TOOLS: Sequence[Tool] = (HYDRA_DDPW, HYDRA_DDPW_LAZY, WRAPPER, WRAPPER_CALLER, TORCHRUN, TORCHRUN_HYDRA,
                                MP_SPAWN, DDPW, DDPW_FORK, SUBMITIT, HYDRA_PLAIN)
FAILURE_TOOLS: Sequence[Tool] = (HYDRA_DDPW, WRAPPER, TORCHRUN, MP_SPAWN)
FOOTPRINT_TOOLS: Sequence[Tool] = (HYDRA_DDPW, HYDRA_DDPW_LAZY, HYDRA_DDPW_LAZY_MULTIRUN, WRAPPER, TORCHRUN, MP_SPAWN)
STEADY_TOOLS: Sequence[Tool] = (HYDRA_DDPW, HYDRA_DDPW_MULTIRUN, WRAPPER, TORCHRUN)
"""Steady state (all_reduce, training loop): every way hydra-ddpw starts ranks, and torchrun."""


def sweep_argv(tool_key: str, n_jobs: int, n_ranks: int) -> list[list[str]]:
    """The command(s) that run a sweep of `n_jobs` jobs of `n_ranks` ranks each, run one after another."""
    jobs = f"job=range(0,{n_jobs})"
    if tool_key == "hydra_ddpw":
        return [python_argv("hydra_app.py", "-m", jobs, f"platform.n_procs_per_node={n_ranks}")]
    if tool_key == "submitit":
        return [python_argv("hydra_app.py", "-m", jobs, "hydra/launcher=submitit_local",
                            f"hydra.launcher.tasks_per_node={n_ranks}")]
    if tool_key == "torchrun":
        return [_torchrun(n_ranks, str(APPS / "plain_script.py"), "trivial", f"job{k}") for k in range(n_jobs)]
    raise KeyError(tool_key)


PACKING_CASES = {
    "trivial": ("1-rank jobs, trivial task, one after another", ("mode=trivial",)),
    "ddp": ("1-rank jobs building DDP (one step), one after another", ("mode=ddp",)),
    "ddp_side": ("1-rank jobs building DDP, side by side (`platform.n_cpus_per_node=1`)",
                 ("mode=ddp", "platform.n_cpus_per_node=1")),
    "train": ("1-rank DDP jobs training 300 steps, one after another", ("mode=train",)),
    "train_side": ("1-rank DDP jobs training 300 steps, side by side (`platform.n_cpus_per_node=1`)",
                   ("mode=train", "platform.n_cpus_per_node=1")),
}
"""The packing section's hydra-ddpw sweeps: label, and the overrides besides `-m job=range(0,N)`."""


def packing_argv(case: str, n_jobs: int) -> list[str]:
    """The hydra-ddpw multirun of `n_jobs` one-rank jobs of a packing case."""
    return python_argv("hydra_app.py", "-m", f"job=range(0,{n_jobs})", "platform.n_procs_per_node=1",
                       *PACKING_CASES[case][1])


SWEEP_TOOLS = {
    "hydra_ddpw": "hydra-ddpw multirun (`-m job=range(0,N)`)",
    "torchrun": "torchrun once per job",
    "submitit": "hydra-submitit-launcher local multirun",
}
