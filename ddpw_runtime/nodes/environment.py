"""Where this machine stands in a job across machines (`platform.n_nodes` > 1, local launcher): node rank, node 0's
address and port, from the platform's fields or else from the variables its platform sets (Kubeflow, SkyPilot, `srun`,
torchrun-style). A bare `RANK` or `WORLD_SIZE` is never read: a node's number on some platforms, a process's on
others. No torch."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ddpw_conf import ConfigError, Platform

DEFAULT_PORT = 29500
"""The rendezvous port when nothing gives one (torchrun's default), so every node agrees on it untold."""


@dataclass(frozen=True)
class Given:
    """A value the node's environment gives, and the variable it came from."""

    variable: str
    value: Any


@dataclass(frozen=True)
class NodeEnvironment:
    """What the platform a node runs on says about the job's nodes (None: it says nothing of that)."""

    name: str
    node_rank: Given | None = None
    n_nodes: Given | None = None
    master_addr: Given | None = None
    master_port: Given | None = None
    ranks_per_node: Given | None = None
    gpus_per_node: Given | None = None


def detect(environ: Mapping[str, str]) -> NodeEnvironment | None:
    """The platform whose variables `environ` holds (Kubeflow, SkyPilot, an `srun` step, torchrun-style), or None."""
    if "PET_NNODES" in environ or "PET_NODE_RANK" in environ:
        if ":" in (nnodes := environ.get("PET_NNODES", "")):
            raise ConfigError("PET_NNODES", nnodes, "an elastic PyTorchJob (a range of workers, c10d rendezvous) lets "
                              "the rendezvous number the nodes; give the PyTorchJob a fixed number of workers (no "
                              "elasticPolicy), so node 0 is the master pod")
        nproc = environ.get("PET_NPROC_PER_NODE", "")
        return NodeEnvironment(
            "Kubeflow PyTorchJob", node_rank=_int(environ, "PET_NODE_RANK"),
            n_nodes=_int(environ, "PET_NNODES", minimum=1),
            master_addr=_text(environ, "MASTER_ADDR") or _text(environ, "PET_MASTER_ADDR"),
            master_port=_int(environ, "MASTER_PORT", minimum=1) or _int(environ, "PET_MASTER_PORT", minimum=1),
            ranks_per_node=_int(environ, "PET_NPROC_PER_NODE", minimum=1) if nproc.strip().isdigit() else None)
    if "SKYPILOT_NODE_RANK" in environ:
        ips = [line.strip() for line in environ.get("SKYPILOT_NODE_IPS", "").splitlines() if line.strip()]
        return NodeEnvironment(
            "SkyPilot", node_rank=_int(environ, "SKYPILOT_NODE_RANK"),
            n_nodes=_int(environ, "SKYPILOT_NUM_NODES", minimum=1),
            master_addr=Given("SKYPILOT_NODE_IPS", ips[0]) if ips else None,
            gpus_per_node=_int(environ, "SKYPILOT_NUM_GPUS_PER_NODE"))
    if "SLURM_STEP_NUM_NODES" in environ and "SLURM_PROCID" in environ:  # a step of srun (not sbatch's script)
        # One copy per node (task i on the step's node i), node 0 the step's first host; SLURM_NNODES and
        # SLURM_NODEID are the allocation's, not the step's, so they are not read.
        nodes = _int(environ, "SLURM_STEP_NUM_NODES", minimum=1)
        tasks = _int(environ, "SLURM_STEP_NUM_TASKS", minimum=1)
        if nodes is not None and tasks is not None and tasks.value != nodes.value:
            raise ConfigError("SLURM_STEP_NUM_TASKS", tasks.value, f"srun runs {tasks.value} copies of this command "
                              f"on {nodes.value} node(s), and each would start ranks of its own; run one per node "
                              "(srun --ntasks-per-node=1 ...), which starts that node's ranks")
        first = first_host(environ.get("SLURM_STEP_NODELIST", ""))
        return NodeEnvironment("SLURM (srun)", node_rank=_int(environ, "SLURM_PROCID"), n_nodes=nodes,
                               master_addr=Given("SLURM_STEP_NODELIST", first) if first else None,
                               master_port=_int(environ, "MASTER_PORT", minimum=1))
    if "NODE_RANK" in environ or "MASTER_ADDR" in environ:
        return NodeEnvironment("torchrun-style variables", node_rank=_int(environ, "NODE_RANK"),
                               master_addr=_text(environ, "MASTER_ADDR"),
                               master_port=_int(environ, "MASTER_PORT", minimum=1))
    return None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: `gpu[03-05,9],cpu1` -> `gpu03`, `rack[1-2]-n[4-5]` -> `rack1-n4`."""
    head = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist.strip())
    return re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", head.group(0)) if head else ""


def _text(environ: Mapping[str, str], variable: str) -> Given | None:
    value = environ.get(variable, "").strip()
    return Given(variable, value) if value else None


def _int(environ: Mapping[str, str], variable: str, minimum: int = 0) -> Given | None:
    value = environ.get(variable, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < minimum:
        raise ConfigError(variable, value, f"the node's environment must give an integer >= {minimum} here; fix "
                          "how the platform sets it, or unset it")
    return Given(variable, int(value))


def _unspecified(addr: str) -> bool:
    """Whether `addr` is `0.0.0.0` or `::`: every address of a machine, none to connect to."""
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_unspecified
    except ValueError:  # a host name
        return False


def place_node(platform: Platform, environ: Mapping[str, str] | None = None) -> Platform:
    """`platform` (validated) with, for `n_nodes` > 1, `node_rank`, `master_addr` and `master_port` filled in from its
    fields or else `environ` (`os.environ` by default). `ConfigError` when they disagree or leave the node rank or
    node 0's address unknown; for `n_nodes` = 1, when the platform runs several machines or says this is not node 0."""
    found = detect(os.environ if environ is None else environ) or NodeEnvironment("")  # (empty: says nothing)
    if platform.n_nodes == 1:
        if (given_nodes := found.n_nodes) is not None and given_nodes.value > 1:
            raise ConfigError("platform.n_nodes", 1, f"{found.name} runs this command on {given_nodes.value} machines "
                              f"({given_nodes.variable}={given_nodes.value}); set platform.n_nodes="
                              f"{given_nodes.value} so that they run one job")
        if (given_rank := found.node_rank) is not None and given_rank.value > 0:
            raise ConfigError("platform.n_nodes", 1, f"this machine's environment ({found.name}) says it is node "
                              f"{given_rank.value} of a job across machines ({given_rank.variable}="
                              f"{given_rank.value}), and one node would run a job of its own; set platform.n_nodes to "
                              f"the job's number of machines on every node, or unset {given_rank.variable}")
        return platform
    values: dict[str, Any] = {}
    for key in ("n_nodes", "node_rank", "master_addr", "master_port"):
        ours, given = getattr(platform, key), getattr(found, key)
        if given is not None and ours is not None and ours != given.value:
            fix = (f"set platform.n_nodes={given.value}, or change the platform's" if key == "n_nodes" else
                   f"make them agree, or leave platform.{key} unset (null) to take the platform's")
            raise ConfigError(f"platform.{key}", ours, f"this machine's environment ({found.name}) gives "
                              f"{given.variable}={given.value}; {fix}")
        values[key] = ours if ours is not None else given.value if given is not None else None
    if (given := found.ranks_per_node) is not None and given.value != platform.ranks_per_node:
        raise ConfigError("platform.n_procs_per_node", platform.n_procs_per_node, f"{found.name} gives "
                          f"{given.variable}={given.value} and this platform runs {platform.ranks_per_node} rank(s) "
                          f"per node; set platform.n_procs_per_node={given.value} (or change the platform's)")
    if (given := found.gpus_per_node) is not None and platform.uses_gpus and platform.n_gpus_per_node > given.value:
        raise ConfigError("platform.n_gpus_per_node", platform.n_gpus_per_node, f"{found.name} gives each node "
                          f"{given.value} GPU(s) ({given.variable}); ask for at most that many")
    for key in ("node_rank", "master_addr"):
        if values[key] is None:
            raise ConfigError(f"platform.{key}", None, f"a job across machines (platform.n_nodes={platform.n_nodes}) "
                              "needs each machine's node rank and node 0's address: set platform.node_rank and "
                              "platform.master_addr on each, or run where a platform sets them (Kubeflow PyTorchJob: "
                              "PET_NODE_RANK, MASTER_ADDR; SkyPilot: SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS; srun: "
                              "SLURM_PROCID, SLURM_STEP_NODELIST; "
                              "torchrun-style: NODE_RANK, MASTER_ADDR); a bare RANK is not read")
    if _unspecified(values["master_addr"]):
        source = found.master_addr if platform.master_addr is None else None
        where = f" (from {source.variable})" if source is not None else ""
        raise ConfigError("platform.master_addr", values["master_addr"], f"this address{where} means every address of "
                          "a machine, not one the other nodes can reach (each would reach itself): give node 0's "
                          "address on the network, the same on every node")
    if values["master_port"] is None:
        values["master_port"] = DEFAULT_PORT
    given_here = {f"platform.{key}": getattr(found, key) for key in ("node_rank", "master_addr", "master_port")
                  if getattr(platform, key) is None and getattr(found, key) is not None}
    placed = replace(platform, **values)
    try:
        placed.validate()
    except ConfigError as error:  # a value the environment gave is named as it gave it
        if (given := given_here.get(error.key)) is None:
            raise
        raise ConfigError(given.variable, given.value, f"{error.key} comes from this machine's environment "
                          f"({found.name}), and {error.fix}; fix how the platform sets {given.variable}, or set "
                          f"{error.key} yourself") from None
    return placed
