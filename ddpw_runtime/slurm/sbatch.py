"""The sbatch side of a SLURM job: submitit's parameters from a job's platform and the launcher options, the script
they make, the rendezvous the nodes use, and the plan a dry run prints. Submits nothing."""

from __future__ import annotations

import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import SlurmLauncherConf
from ddpw_runtime import _compat
from ddpw_runtime.launch.plan import LaunchPlan, plan_local

PORT_BASE = 20000
PORT_SPAN = 20000
"""A multi-node job's rendezvous port, unless `platform.master_port` is set: PORT_BASE + job id % PORT_SPAN."""

_SETUP_FAILED = ("trap 'echo \"hydra-ddpw: a line of hydra.launcher.setup failed (exit $?): $BASH_COMMAND\" >&2' "
                 "ERR")
"""The first line of the batch script's setup: names the line of `hydra.launcher.setup` that failed."""

_GPU_KEYS = {"gres", "gpus", "gpus_per_task", "gpus_per_node"}
"""Additional sbatch options that ask for GPUs themselves; then `--gpus-per-node` is not added."""


def check_ports(platforms: Sequence[tuple[int, Platform]]) -> None:
    """Refuse, before anything is submitted, jobs of one sweep (`(job number, platform)`) that set the same
    `platform.master_port`: SLURM may run them on one node at the same time, where all but one would fail."""
    jobs_of: defaultdict[int, list[int]] = defaultdict(list)
    for idx, platform in platforms:
        if platform.master_port is not None and platform.ipc_protocol == "tcp":
            jobs_of[platform.master_port].append(idx)
    for port, jobs in jobs_of.items():
        if len(jobs) > 1:
            raise ConfigError("platform.master_port", port, f"jobs {', '.join(f'#{idx}' for idx in jobs)} of this "
                              "sweep set it, and SLURM may run them on one node at the same time, where all but one "
                              "would fail: leave platform.master_port unset (null), so that each job gets a port of "
                              f"its own (a free one on one node, {PORT_BASE} + its SLURM job id % {PORT_SPAN} across "
                              "nodes)")


def node_platform(platform: Platform) -> Platform:
    """The platform the nodes run: `n_cpus_per_node` as the job asks SLURM for it (as given, else one CPU per rank),
    so the ranks split exactly the CPUs they were given."""
    return replace(platform, n_cpus_per_node=platform.n_cpus_per_node or platform.ranks_per_node)


def sbatch_parameters(platform: Platform, options: SlurmLauncherConf) -> dict[str, Any]:
    """submitit's `SlurmExecutor` parameters for a job of `platform` (validated): one task per node (the node's
    controller, which starts its ranks) holding all the node's CPUs and GPUs."""
    extra = dict(platform.slurm_additional_parameters)
    params: dict[str, Any] = {
        "job_name": platform.name,
        "time": max(1, math.ceil(platform.timeout_min)),
        "nodes": platform.n_nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": node_platform(platform).n_cpus_per_node,
        "signal_delay_s": options.signal_delay_s,
        "array_parallelism": options.array_parallelism,
        "srun_args": ["--kill-on-bad-exit=1"],  # a dead node controller takes the other nodes, not left waiting
    }
    if platform.partition is not None:  # else the cluster's default partition
        params["partition"] = platform.partition
    if platform.uses_gpus and not _GPU_KEYS & {key.replace("-", "_") for key in extra}:
        params["gpus_per_node"] = platform.n_gpus_per_node
    if platform.mem_per_node:
        params["mem"] = f"{platform.mem_per_node}GB"
    for key in ("qos", "account", "constraint", "exclude"):
        if getattr(options, key) is not None:
            params[key] = getattr(options, key)
    if options.setup:  # a line that fails ends the job, saying which, rather than the nodes starting without it
        params["setup"] = [_SETUP_FAILED, "set -e", *options.setup, "set +e", "trap - ERR"]
    if extra:
        params["additional_parameters"] = extra
    return params


def sbatch_script(params: dict[str, Any], folder: Path, array_size: int = 1) -> str:
    """The sbatch script submitit submits for `params` (a job array when `array_size` > 1) from its absolute
    `folder`, with each node task's command as submitit's `SlurmExecutor` writes it."""
    command = " ".join([shlex.quote(sys.executable), f"-u -m {_compat.SUBMITIT_ENTRY}", shlex.quote(str(folder))])
    return _compat.sbatch_script(command, folder, array_size if array_size > 1 else None, **params)


def rendezvous(platform: Platform, first_host: str, job_id: str) -> tuple[str | None, int | None]:
    """Where the ranks of a job meet, as `run_ranks` takes it (`master_addr`, `master_port`): (None, None) for one
    node (loopback, a free port); else the allocation's first node and a port from the job id. `platform.master_addr`
    / `master_port`, which `run_ranks` applies, win over both."""
    if platform.n_nodes == 1:
        return None, None
    return first_host, PORT_BASE + int(job_id) % PORT_SPAN


def _plan(platform: Platform, output_dir: Path) -> LaunchPlan:
    """The plan of a job's node 0 as known before submission (no host, port or job id)."""
    return plan_local(node_platform(platform), Path(output_dir).resolve(), Path("<private dir>"), "<SLURM job id>",
                      master_addr="-", master_port=1)


def console_logs(platform: Platform, output_dir: Path) -> dict[int, Path]:
    """The log files of the ranks a job of `platform` shows on the console (`platform.console_ranks`)."""
    plan = _plan(platform, output_dir)
    return {rank: plan.log_file(rank) for rank in plan.console_ranks}


def describe(platform: Platform, output_dir: Path, env_set: Mapping[str, Any] | None = None) -> str:
    """The launch plan a dry run prints for a job of `platform`: what every node will run (`env_set`: the job's
    `hydra.job.env_set`)."""
    plan = _plan(platform, output_dir)
    if platform.n_nodes == 1:
        where = f"{platform.master_addr or '127.0.0.1'}:{platform.master_port or '<a free port>'}"
    else:
        where = (f"{platform.master_addr or '<first node of the allocation>'}:"
                 f"{platform.master_port or f'<{PORT_BASE} + SLURM job id % {PORT_SPAN}>'}")
    return replace(plan, init_method=f"tcp://{where}", platform=platform).describe(env_set)
