"""One job across machines without SLURM (docs/multi-node.md): the same command on every node, node 0 deciding.
Two nodes are two process trees on this machine, started 1-2 s apart, meeting at 127.0.0.2 (not `localhost`),
driven by explicit fields, a Kubeflow PyTorchJob pod's environment and SkyPilot's; one rank per node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import LocalLauncherConf
from ddpw_runtime.launch.bounds import REPORT_S
from ddpw_runtime.launch.rendezvous import listen
from ddpw_runtime.nodes.environment import DEFAULT_PORT, detect, place_node
from tests.helpers import APPS, job_dirs, leftover, seen, wait_for

HOST = "127.0.0.2"
_CLEAN = ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT", "MASTER_ADDR",
          "MASTER_PORT", "NODE_RANK", "RANK", "WORLD_SIZE", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS",
          "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
          "SLURM_PROCID", "SLURM_STEP_NODELIST")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ----------------------------------------------------------------------- where a node stands, before anything starts
def _two(**fields: object) -> Platform:
    return Platform(n_nodes=2, **fields)  # type: ignore[arg-type]


def test_explicit_fields_place_the_node_and_every_node_agrees_on_torchruns_port() -> None:
    placed = place_node(_two(node_rank=1, master_addr=HOST), environ={})
    assert (placed.node_rank, placed.master_addr, placed.master_port) == (1, HOST, DEFAULT_PORT) == (1, HOST, 29500)


def test_a_pytorchjob_pods_environment_places_the_node_and_its_bare_rank_is_never_read() -> None:
    pod = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "MASTER_ADDR": "job-master-0",
           "MASTER_PORT": "23456", "RANK": "7", "WORLD_SIZE": "2"}
    placed = place_node(_two(), environ=pod)
    assert (placed.node_rank, placed.master_addr, placed.master_port) == (1, "job-master-0", 23456)
    assert detect(pod) is not None and detect(pod).name == "Kubeflow PyTorchJob"  # type: ignore[union-attr]


def test_skypilots_environment_places_the_node_at_the_head_nodes_address() -> None:
    node = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "0"}
    placed = place_node(_two(), environ=node)
    assert (placed.node_rank, placed.master_addr, placed.master_port) == (1, "10.0.0.5", DEFAULT_PORT)


def test_torchrun_style_variables_place_the_node() -> None:
    placed = place_node(_two(), environ={"NODE_RANK": "0", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29400"})
    assert (placed.node_rank, placed.master_addr, placed.master_port) == (0, "10.1.1.1", 29400)


@pytest.mark.parametrize("fields, environ", [({"master_addr": "0.0.0.0"}, {}), ({"master_addr": "::"}, {}),
                                             ({}, {"MASTER_ADDR": "0.0.0.0"})], ids=["field", "ipv6", "variable"])
def test_the_unspecified_address_is_refused_as_node_0s_address(fields: dict, environ: dict) -> None:
    """`0.0.0.0` is every address of a machine: node 0 would listen, but each other node would reach itself."""
    with pytest.raises(ConfigError) as info:
        place_node(_two(node_rank=0, **fields), environ=environ)
    message = str(info.value)
    assert message.startswith("platform.master_addr=") and "give node 0's address on the network" in message
    assert ("(from MASTER_ADDR)" in message) == bool(environ)


_SRUN_STEP = {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1",
              "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NNODES": "4", "SLURM_NODEID": "3",
              "SLURM_JOB_NODELIST": "gpu[05-08]"}
"""What `srun -N2 --ntasks-per-node=1` gives the copy on the step's second node, in an allocation of four."""


def test_an_srun_steps_environment_places_the_node_by_the_step_not_the_allocation() -> None:
    placed = place_node(_two(), environ=_SRUN_STEP)
    assert (placed.node_rank, placed.master_addr, placed.master_port) == (1, "gpu07", DEFAULT_PORT)


def test_sbatchs_own_script_is_no_step_and_places_nothing() -> None:
    script = {"SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
              "SLURM_JOB_NODELIST": "n[1-2]"}
    assert detect(script) is None


@pytest.mark.parametrize(("nodelist", "first"), [
    ("n1", "n1"), ("n1,n2", "n1"), ("gpu[03-05,9],cpu1", "gpu03"), ("rack[1-2]-n[4-5]", "rack1-n4"),
    ("gnode[10,20,25,37]", "gnode10"),
])
def test_node_0_of_an_srun_step_is_the_first_host_of_its_node_list(nodelist: str, first: str) -> None:
    assert place_node(_two(), environ={**_SRUN_STEP, "SLURM_STEP_NODELIST": nodelist}).master_addr == first


def test_one_node_ignores_the_environment_it_does_not_need() -> None:
    platform = Platform()
    assert place_node(platform, environ={"NODE_RANK": "0", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1"}) is platform


@pytest.mark.parametrize(("fields", "environ", "key", "hint"), [
    pytest.param({}, {}, "platform.node_rank", "PET_NODE_RANK", id="nothing-found"),
    pytest.param({"node_rank": 1}, {}, "platform.master_addr", "SKYPILOT_NODE_IPS", id="no-address"),
    pytest.param({}, {"RANK": "1", "WORLD_SIZE": "2"}, "platform.node_rank", "a bare RANK is not read",
                 id="bare-rank-only"),
    pytest.param({}, {"PET_NNODES": "3", "PET_NODE_RANK": "0", "MASTER_ADDR": "m"}, "platform.n_nodes",
                 "(Kubeflow PyTorchJob) gives PET_NNODES=3; set platform.n_nodes=3, or change the platform's",
                 id="pytorchjob-nnodes-disagree"),
    pytest.param({"node_rank": 0}, {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "a\nb", "SKYPILOT_NUM_NODES": "2"},
                 "platform.node_rank", "SKYPILOT_NODE_RANK=1", id="skypilot-rank-disagrees"),
    pytest.param({"master_port": 1234}, {"NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "4321"},
                 "platform.master_port", "MASTER_PORT=4321", id="port-disagrees"),
    pytest.param({}, {"PET_NNODES": "1:2", "PET_NODE_RANK": "0"}, "PET_NNODES", "elastic", id="elastic-pytorchjob"),
    pytest.param({}, {"PET_NNODES": "2", "PET_NODE_RANK": "one", "MASTER_ADDR": "m"}, "PET_NODE_RANK", "integer",
                 id="rank-not-a-number"),
    pytest.param({}, {"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "m", "PET_NPROC_PER_NODE": "4"},
                 "platform.n_procs_per_node", "PET_NPROC_PER_NODE=4", id="ranks-per-node-disagree"),
    pytest.param({}, {**_SRUN_STEP, "SLURM_STEP_NUM_TASKS": "8"}, "SLURM_STEP_NUM_TASKS", "--ntasks-per-node=1",
                 id="srun-a-task-per-rank"),
    pytest.param({"node_rank": 0}, _SRUN_STEP, "platform.node_rank", "SLURM_PROCID=1", id="srun-rank-disagrees"),
    pytest.param({}, {"NODE_RANK": "5", "MASTER_ADDR": "m"}, "NODE_RANK", "platform.node_rank comes from this "
                 "machine's environment (torchrun-style variables), and nodes are numbered 0..1",
                 id="rank-beyond-the-nodes"),
    pytest.param({}, {"NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "99999"}, "MASTER_PORT",
                 "use a port in 1..65535", id="port-out-of-range"),  # (both named the platform's key, never set)
])
def test_a_node_that_cannot_be_placed_is_refused_naming_key_value_and_fix(fields: dict, environ: dict, key: str,
                                                                          hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        place_node(_two(**fields), environ=environ)
    assert info.value.key == key and hint in str(info.value)


def test_one_node_where_the_platform_runs_the_command_on_several_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"platform.n_nodes=1: SkyPilot runs this command on 2 machines"):
        place_node(Platform(), environ={"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2"})
    with pytest.raises(ConfigError, match=r"SLURM \(srun\) runs this command on 2 machines .*n_nodes=2"):
        place_node(Platform(), environ=_SRUN_STEP)


@pytest.mark.parametrize(("environ", "variable"), [
    pytest.param({"NODE_RANK": "1", "MASTER_ADDR": HOST}, "NODE_RANK=1", id="torchrun-style"),
    pytest.param({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": HOST}, "SKYPILOT_NODE_RANK=1", id="skypilot"),
    pytest.param({"PET_NODE_RANK": "1", "MASTER_ADDR": HOST}, "PET_NODE_RANK=1", id="pytorchjob"),
])
def test_one_node_where_the_environment_says_it_is_another_node_than_0_is_refused(environ: dict,
                                                                                   variable: str) -> None:
    """A node other than 0 that leaves `platform.n_nodes` at 1 would run a whole job of its own."""
    with pytest.raises(ConfigError) as info:
        place_node(Platform(), environ=environ)
    assert info.value.key == "platform.n_nodes" and f"says it is node 1 of a job across machines ({variable})" in str(
        info.value) and "set platform.n_nodes to the job's number of machines" in str(info.value)


@pytest.mark.parametrize(("fields", "key", "hint"), [
    pytest.param({"n_nodes": 2, "node_rank": 2}, "platform.node_rank", "0..1", id="node_rank-outside"),
    pytest.param({"n_nodes": 2, "node_rank": -1}, "platform.node_rank", "integer >= 0", id="node_rank-negative"),
    pytest.param({"join_timeout_min": 0}, "platform.join_timeout_min", "positive", id="join_timeout-0"),
    pytest.param({"device": "mps", "n_nodes": 2}, "platform.n_nodes", "device=cpu or gpu", id="mps-across"),
])
def test_bad_values_of_the_new_fields_are_refused(fields: dict, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        Platform(**fields).validate()
    assert info.value.key == key and hint in str(info.value)


def test_node_0s_rendezvous_refused_suggests_only_fixes_that_work_across_machines() -> None:
    """Across machines a null `master_port` is 29500 on every node and a null `master_addr` is refused, so neither
    is offered as the way out."""
    with socket.create_server((HOST, 0)) as other_program:
        port = other_program.getsockname()[1]
        with pytest.raises(ConfigError) as busy:
            listen(_two(node_rank=0, master_addr=HOST, master_port=port), None, None)
    with pytest.raises(ConfigError) as foreign:
        listen(_two(node_rank=0, master_addr="10.255.255.1", master_port=free_port()), None, None)
    assert "choose a free port; give every node the same one" in str(busy.value)
    assert "use one of its own addresses, the one the other nodes reach it at" in str(foreign.value)
    assert "null" not in str(busy.value) + str(foreign.value)


def test_restarts_of_a_job_across_machines_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"hydra.launcher.max_restarts=1: a job across machines"):
        LocalLauncherConf(max_restarts=1).validate_platform(_two(node_rank=0, master_addr=HOST))


@pytest.mark.subprocess
def test_a_multirun_whose_jobs_span_different_node_counts_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(APPS / "app.py"), "-m", "platform.n_nodes=1,2", "platform.node_rank=0",
                           f"platform.master_addr={HOST}", "platform.n_procs_per_node=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env({}))
    assert proc.returncode == 1
    assert "platform.n_nodes='1,2': every job of a multirun across machines runs on the same machines" in proc.stderr
    assert not list(tmp_path.rglob("rank_*.log"))


# ----------------------------------------------------------------------- two nodes, two process trees
def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN}
    return {**env, "GLOO_SOCKET_IFNAME": "lo", **extra}  # the ranks' traffic stays on loopback


def _node(cwd: Path, overrides: list[str], environ: dict[str, str], app: str = "app.py") -> subprocess.Popen:
    flags = [arg for arg in overrides if arg.startswith("-")]  # (`-m` before the overrides)
    overrides = flags + [arg for arg in overrides if arg not in flags]
    return subprocess.Popen([sys.executable, str(APPS / app), *overrides], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=_env(environ))


def _explicit(port: int, node: int) -> tuple[list[str], dict[str, str]]:
    return [f"platform.node_rank={node}", f"platform.master_addr={HOST}", f"platform.master_port={port}"], {}


def _pytorchjob(port: int, node: int) -> tuple[list[str], dict[str, str]]:
    return [], {"PET_NNODES": "2", "PET_NODE_RANK": str(node), "PET_NPROC_PER_NODE": "1", "MASTER_ADDR": HOST,
                "MASTER_PORT": str(port), "PET_MASTER_ADDR": HOST, "PET_MASTER_PORT": str(port), "RANK": str(node),
                "WORLD_SIZE": "2"}


def _skypilot(port: int, node: int) -> tuple[list[str], dict[str, str]]:
    skypilot = {"SKYPILOT_NODE_RANK": str(node), "SKYPILOT_NODE_IPS": f"{HOST}\n127.0.0.3", "SKYPILOT_NUM_NODES": "2",
                "SKYPILOT_NUM_GPUS_PER_NODE": "0"}
    return [f"platform.master_port={port}"], skypilot  # SkyPilot gives no port: one the test knows is free


def _on_gpus(port: int, node: int) -> tuple[list[str], dict[str, str]]:
    """Node `node` told explicitly, with a GPU of its own where this machine has two. With one, both nodes' ranks are
    on it: NCCL refuses two ranks of one host on one GPU, so each node gets a host id of its own (`NCCL_HOSTID`),
    and NCCL joins them as it joins two machines, over its network transport (on loopback)."""
    own, environ = _explicit(port, node)
    if torch.cuda.device_count() >= 2:
        gpu = {"CUDA_VISIBLE_DEVICES": str(node)}
    else:
        gpu = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_HOSTID": f"node-{node}"}
    gpu["NCCL_SOCKET_IFNAME"] = "lo"
    return [*own, "hydra/launcher=ddpw_gpu", "platform.n_gpus_per_node=1"], {**environ, **gpu}


Way = Callable[[int, int], tuple[list[str], dict[str, str]]]
"""How node `k` of a job whose rendezvous port is `p` is told where it stands: its overrides and environment."""
ON_GPUS = pytest.param(_on_gpus, id="gpu-nccl",
                       marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))
"""Nodes of `ddpw_gpu` ranks over NCCL (skipped without a GPU)."""
PLATFORMS = [pytest.param(_explicit, id="explicit"), pytest.param(_pytorchjob, id="pytorchjob"),
             pytest.param(_skypilot, id="skypilot")]


def _start_two(tmp_path: Path, way: Way, *overrides: str, second_after: float = 1.5,
               app: str = "app.py") -> tuple[subprocess.Popen, ...]:
    port = free_port()
    nodes = []
    for node in (0, 1):
        own, environ = way(port, node)
        nodes.append(_node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", *own, *overrides], environ,
                           app))
        if node == 0:
            time.sleep(second_after)
    return tuple(nodes)


def _two_running(tmp_path: Path, *overrides: str, behaviour: str = "wait",
                 way: Way = _explicit) -> tuple[subprocess.Popen, subprocess.Popen, dict]:
    """Two nodes of a job (the first job of a multirun, with `-m`) whose ranks do `behaviour` (wait for a signal),
    once both ranks run; what each rank recorded."""
    zero, one = _start_two(tmp_path, way, f"behaviour={behaviour}", *overrides)
    wait_for(lambda: bool(job_dirs(tmp_path)) and len(seen(job_dirs(tmp_path)[0])) == 2, timeout=60,
             what="both ranks to run")
    return zero, one, seen(job_dirs(tmp_path)[0])


@pytest.mark.subprocess
@pytest.mark.parametrize("way", PLATFORMS)
def test_a_plain_run_spans_two_nodes_in_node_0s_output_dir(tmp_path: Path, way: Way) -> None:
    zero, one = _start_two(tmp_path, way, "hydra.job.chdir=true")
    out0, err0 = zero.communicate(timeout=120)
    out1, err1 = one.communicate(timeout=120)
    assert (zero.returncode, one.returncode) == (0, 0), err0 + err1
    [job] = job_dirs(tmp_path)  # one output dir, `.hydra/` written once, by node 0
    ranks = seen(job)
    assert sorted(ranks) == [0, 1]
    assert [ranks[r]["env"]["GROUP_RANK"] for r in (0, 1)] == ["0", "1"]
    assert {r["world_size"] for r in ranks.values()} == {2} and ranks[0]["all_reduce_world"] == 2.0
    assert ranks[0]["output_dir"] == ranks[1]["output_dir"] == str(job)
    assert ranks[0]["cwd"] == ranks[1]["cwd"] == str(job)  # the dir node 0's job entered
    assert ranks[0]["run_id"] == ranks[1]["run_id"]
    assert "COMPLETED" in out0 and "COMPLETED" not in out1  # the job's report is on node 0's console
    # Node 1 logs in the job's format (not Hydra's own `[HYDRA]`), on its console only: the job log is node 0's.
    assert "][ddpw][INFO] - 2 rank(s) (2 node(s) x 1)" in out1 and "[HYDRA]" not in out1 + err1, out1 + err1
    assert (job / "app.log").read_text().count("2 rank(s) (2 node(s) x 1)") == 1
    assert "[ddpw] every rank of this node (node 1) returned; node 0 shows the job's report" in err1
    assert leftover(ranks) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("way", [pytest.param(_explicit, id="cpu-gloo"), ON_GPUS])
def test_a_failure_on_node_1_ends_both_and_node_0_shows_the_root_cause_once(tmp_path: Path, way: Way) -> None:
    zero, one = _start_two(tmp_path, way, "behaviour=raise", "fail_rank=1")
    _, err0 = zero.communicate(timeout=120)
    _, err1 = one.communicate(timeout=120)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert err0.count("rank 1 (node 1) failed: ValueError: rank asked to fail") == 1
    assert "raise ValueError(\"rank asked to fail\")" in err0
    # Node 1 says its rank failed, also when node 0's stop (its rank saw the peer go) reached it first; node 0 alone
    # shows the error.
    assert "[ddpw] rank 1 failed on this node (node 1); node 0 shows the job's error" in err1, err1
    assert "stopped on node 0" not in err1 and "Traceback" not in err1, err1


@pytest.mark.subprocess
def test_a_rank_of_node_1_that_failed_first_is_named_by_node_1_also_once_node_0s_stop_came_first(
        tmp_path: Path) -> None:
    """Rank 1 (node 1) raises; as it ends, after its result is written, it ends what it sends on its connections
    and waits to be stopped: rank 0 fails on the closed connection, node 0 stops the job, and node 1 sees that stop
    before its own rank ends (it ends only by the stop's SIGTERM). Rank 1 is the root cause: node 1 says its rank
    failed, as node 0 shows, not that node 0 stopped the job (as it did when any other node's stop came first)."""
    zero, one = _start_two(tmp_path, _explicit, "behaviour=raise_then_close", "fail_rank=1")
    _, err0 = zero.communicate(timeout=120)
    _, err1 = one.communicate(timeout=120)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert err0.count("rank 1 (node 1) failed: ValueError: rank asked to fail") == 1, err0
    assert "[ddpw] rank 1 failed on this node (node 1); node 0 shows the job's error" in err1, err1
    assert "stopped on node 0" not in err1, err1


@pytest.mark.subprocess
@pytest.mark.parametrize("way", [pytest.param(_explicit, id="cpu-gloo"), ON_GPUS])
def test_ctrl_c_on_node_1_ends_the_job_on_both_and_node_0_says_which_node(tmp_path: Path, way: Way) -> None:
    zero, one, ranks = _two_running(tmp_path, way=way)
    started = time.monotonic()
    one.send_signal(signal.SIGINT)
    _, err1 = one.communicate(timeout=60)
    _, err0 = zero.communicate(timeout=60)
    assert one.returncode == 130, err1
    assert zero.returncode == 1 and "node 1 got Ctrl-C (SIGINT), which ends the job on every node" in err0, err0
    assert time.monotonic() - started < 20
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="every rank to end")


@pytest.mark.subprocess
@pytest.mark.parametrize("pressed", [0, 1], ids=["node-0", "node-1"])
def test_sigterm_on_one_node_reaches_every_rank_of_the_other_with_its_grace(tmp_path: Path, pressed: int) -> None:
    """One machine preempted (SIGTERM to node 1, as Kubernetes evicts a pod): rank 0, on node 0 in the program's own
    process, gets SIGTERM too, and its handler saves a checkpoint, as on one machine; it was stopped as after another
    rank's failure (`RankStopped`, no handler run, nothing saved). Each node notes in its ranks' logs how they ended
    (SIGTERM to node 0: rank 1's log, on node 1, said nothing of it)."""
    zero, one, ranks = _two_running(tmp_path)
    got, other = (zero, one) if pressed == 0 else (one, zero)
    got.send_signal(signal.SIGTERM)
    _, err_got = got.communicate(timeout=60)
    _, err_other = other.communicate(timeout=60)
    assert got.returncode == 143, err_got
    assert other.returncode == 1 and f"node {pressed} got SIGTERM, which ends the job on every node" in err_other, \
        err_other
    [job] = job_dirs(tmp_path)
    assert sorted(path.name for path in job.glob("saved_rank_*.txt")) == ["saved_rank_0.txt", "saved_rank_1.txt"]
    assert "--- rank 1 was stopped: SystemExit: 143" in (job / "rank_1.log").read_text()
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="every rank to end")


@pytest.mark.subprocess
def test_a_node_that_never_starts_is_named_by_node_0_within_the_join_timeout(tmp_path: Path) -> None:
    own, environ = _explicit(free_port(), 0)
    started = time.monotonic()
    zero = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", "platform.join_timeout_min=0.1",
                            *own], environ)
    _, err = zero.communicate(timeout=60)
    assert zero.returncode == 1
    # what it waits for, once it has waited 5 s (a node that joins a moment later is not waited for on the console)
    assert f"[ddpw] node 0 is waiting at {HOST}:{own[2].split('=')[1]} for node(s) 1 to join (up to " \
           "platform.join_timeout_min=0.1)" in err, err
    assert "node(s) 1 of 2 never joined within platform.join_timeout_min=0.1" in err
    assert time.monotonic() - started < 30



@pytest.mark.subprocess
def test_a_node_that_joined_and_died_while_node_0_waits_for_another_is_named_at_once(tmp_path: Path) -> None:
    """3 nodes: node 1 joins, node 2 never starts, node 1 is killed (SIGKILL, as the OOM killer would) while node 0
    still waits for node 2: node 0 names node 1 as lost within seconds, not after the join timeout (it waited, named
    only node 2, or a gloo error of its rank once node 2 came)."""
    port = free_port()
    base = ["platform.n_nodes=3", "platform.n_procs_per_node=1", "platform.join_timeout_min=1", "behaviour=wait"]
    zero = _node(tmp_path, [*base, *_explicit(port, 0)[0]], {})
    one = _node(tmp_path, [*base, *_explicit(port, 1)[0]], {})
    wait_for(lambda: bool(job_dirs(tmp_path)) and (job_dirs(tmp_path)[0] / "rank_1.log").exists(), timeout=60,
             what="node 1 to join and start its rank")
    started = time.monotonic()
    one.kill()
    _, err = zero.communicate(timeout=60)
    one.communicate()
    assert zero.returncode == 1, err
    assert "node 1 could no longer be reached (its program ended: its connection to node 0 closed); node(s) 2 had " \
           "not joined yet" in err, err
    assert time.monotonic() - started < 30  # not the join timeout (60 s)


@pytest.mark.subprocess
def test_a_node_that_joined_says_which_node_never_joined(tmp_path: Path) -> None:
    """3 nodes, node 2 never starts: node 1, which joined and started its rank, names node 2 as node 0 does (it said
    that a rank failed or the time limit passed on node 0)."""
    port = free_port()
    base = ["platform.n_nodes=3", "platform.n_procs_per_node=1", "platform.join_timeout_min=0.05", "behaviour=wait"]
    zero = _node(tmp_path, [*base, *_explicit(port, 0)[0]], {})
    one = _node(tmp_path, [*base, *_explicit(port, 1)[0]], {})
    _, err0 = zero.communicate(timeout=60)
    _, err1 = one.communicate(timeout=60)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    never = "node(s) 2 of 3 never joined within platform.join_timeout_min=0.05"
    assert never in err0, err0
    assert f"[ddpw] {never}" in err1 and "a rank failed" not in err1, err1


@pytest.mark.subprocess
def test_a_multirun_whose_nodes_never_start_ends_without_waiting_for_them_to_read_its_end(tmp_path: Path) -> None:
    """Node 0's sweep ends waiting (up to 10 s) only for the nodes still following it: not for every node the job lost
    (it counted one per job: with two lost, it waited the whole 10 s for the second)."""
    own, environ = _explicit(free_port(), 0)
    started = time.monotonic()
    zero = _node(tmp_path, ["-m", "platform.n_nodes=3", "platform.n_procs_per_node=1",
                            "platform.join_timeout_min=0.05", "fail_rank=0,1", *own], environ)
    _, err = zero.communicate(timeout=60)
    assert zero.returncode == 1
    assert "node(s) 1, 2 of 3 never joined within platform.join_timeout_min=0.05" in err, err
    assert time.monotonic() - started < 3 + 10  # the join timeout, and less than the 10 s it waited for node 2

@pytest.mark.subprocess
def test_a_node_that_cannot_reach_node_0_names_the_address_and_port(tmp_path: Path) -> None:
    port = free_port()
    own, environ = _explicit(port, 1)
    one = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", "platform.join_timeout_min=0.05",
                           *own], environ)
    _, err = one.communicate(timeout=60)
    assert one.returncode == 1
    waiting = f"[ddpw] node 1 is waiting for node 0 at {HOST}:{port} (up to platform.join_timeout_min=0.05)"
    assert err.count(waiting) == 1
    # (this test's nodes share one machine; on two, a loopback address is the mistake that keeps them apart)
    assert f"{waiting}; {HOST} is a loopback address, which only a node on node 0's own machine reaches: give " \
           "platform.master_addr node 0's address on the network\n" in err, err
    assert f"node 1 could not reach node 0 at {HOST}:{port} within platform.join_timeout_min=0.05" in err
    assert not job_dirs(tmp_path)  # it never ran a job of its own


def _answer_as_a_web_server(listening: socket.socket) -> None:
    """Answer every connection to `listening` with an HTTP 400 at once and close it, as a web server or proxy does."""
    while True:
        try:
            peer, _ = listening.accept()
        except OSError:
            return
        with peer, contextlib.suppress(OSError):
            peer.settimeout(1)
            peer.recv(100)
            peer.sendall(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")


@pytest.mark.subprocess
@pytest.mark.parametrize("answers", [False, True], ids=["never-answers", "answers-as-a-web-server"])
def test_a_node_that_reaches_another_program_on_node_0s_port_says_so_within_a_bound(tmp_path: Path,
                                                                                    answers: bool) -> None:
    """A program that holds node 0's port and never answers (torch's own store client would wait for it for ever), or
    answers something else (torch's client gives up a little after its timeout: the node ended as it did, and was
    aborted, exit 134, about 1 run in 4). The console has that one line, not torch's C++ error of its client."""
    with socket.socket() as other_program:
        other_program.bind((HOST, 0))
        other_program.listen()
        if answers:
            threading.Thread(target=_answer_as_a_web_server, args=(other_program,), daemon=True).start()
        port = other_program.getsockname()[1]
        own, environ = _explicit(port, 1)
        one = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", *own], environ)
        try:
            _, err = one.communicate(timeout=60)
        finally:
            one.kill()
        with contextlib.suppress(OSError):
            other_program.shutdown(socket.SHUT_RDWR)  # (ends the answering thread)
    assert one.returncode == 1, err
    assert f"node 1 reached {HOST}:{port}, but what listens there did not answer as node 0's store within" in err
    assert "choose a free platform.master_port" in err
    # (torch's client logged its failure above that line, a C++ error with a stack of a dozen frames)
    assert "TCPStore.cpp" not in err and "frame #" not in err, err
    assert not job_dirs(tmp_path)


@pytest.mark.subprocess
def test_the_time_limit_names_the_rank_outside_the_collective_on_another_node(tmp_path: Path) -> None:
    """Rank 1, on node 1, is stuck loading a batch while rank 0, on node 0, waits for it in all_reduce: node 0's report
    has every node's ranks and names rank 1 (each node showed only its own ranks, and so named no rank)."""
    zero, one = _start_two(tmp_path, _explicit, "behaviour=hold_up", "platform.timeout_min=0.1")
    err0 = zero.communicate(timeout=120)[1]
    err1 = one.communicate(timeout=120)[1]
    assert zero.returncode == 1 and one.returncode == 1, err0 + err1
    assert "ran past its time limit (platform.timeout_min=0.1) and was stopped; where each rank was" in err0, err0
    assert f"  rank 1: NOT IN THE COLLECTIVE, at load_batch ({APPS / 'app.py'}:" in err0, err0
    assert "  rank 0: waiting in all_reduce, at hold_up (" in err0, err0
    assert "node 0 shows where each rank was" in err1 or "the job was stopped on node 0" in err1, err1
    assert "NOT IN THE COLLECTIVE" not in err1 and "Traceback" not in err1, err1


@pytest.mark.subprocess
def test_a_second_process_started_as_the_same_node_or_as_a_node_the_job_has_not_is_refused_and_the_job_goes_on(
        tmp_path: Path) -> None:
    """A process started as node 1 again, or as node 2 of 3 where node 0's job has 2 nodes (its rank 2 joined a world
    of 2 and failed, and node 0 said the job was stopped on node 2, showing no cause), is refused before it starts a
    rank."""
    zero, one, ranks = _two_running(tmp_path)
    port = int(ranks[0]["env"]["MASTER_PORT"])
    own, environ = _explicit(port, 1)
    again = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", *own], environ)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 1, err
    assert f"node 1 already joined node 0's job at {HOST}:{port}: another process runs as node 1" in err
    own, environ = _explicit(port, 2)
    stray = _node(tmp_path, ["platform.n_nodes=3", "platform.n_procs_per_node=1", *own], environ)
    _, err = stray.communicate(timeout=60)
    assert stray.returncode == 1, err
    assert f"node 2 is not a node of node 0's job at {HOST}:{port}, which runs on 2 node(s) (platform.n_nodes=2 on " \
           "node 0, 3 here): give every machine the same platform.n_nodes and its own platform.node_rank from 0 to 1" \
           in err, err
    assert not (job_dirs(tmp_path)[0] / "rank_2.log").exists()
    assert (zero.poll(), one.poll()) == (None, None)  # the job goes on, untouched
    zero.send_signal(signal.SIGINT)
    zero.communicate(timeout=60)
    one.communicate(timeout=60)
    assert (zero.returncode, one.returncode) == (130, 1)
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="every rank to end")


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("-m",)], ids=["plain", "multirun"])
def test_a_node_whose_overrides_differ_runs_node_0s_config_and_names_the_difference(tmp_path: Path,
                                                                                   mode: tuple[str, ...]) -> None:
    port = free_port()
    own_dir = f"hydra.{'sweep' if mode else 'run'}.dir=elsewhere"  # (Hydra's own overrides are node 0's too)
    nodes = {}
    for node, typed in ((0, ["behaviour=ok"]), (1, ["behaviour=raise", own_dir])):  # (rank 1 would fail with node 1's)
        own, environ = _explicit(port, node)
        nodes[node] = _node(tmp_path, [*mode, "platform.n_nodes=2", "platform.n_procs_per_node=1", *typed, *own],
                            environ)
        time.sleep(1.5 if node == 0 else 0)
    errs = {node: proc.communicate(timeout=120)[1] for node, proc in nodes.items()}
    assert (nodes[0].returncode, nodes[1].returncode) == (0, 0), errs
    assert seen(job_dirs(tmp_path)[0])[1]["cfg_behaviour"] == "ok"
    assert errs[1].count("[ddpw] node 1 runs node 0's config, whose overrides differ from this node's: here "
                         f"behaviour=raise {own_dir}, on node 0 behaviour=ok\n") == 1, errs[1]
    assert not (tmp_path / "elsewhere").exists()
    assert "differ" not in errs[0]  # (node_rank, which differs by design, is never named)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("-m",)], ids=["plain", "multirun"])
def test_a_dry_run_on_another_node_shows_what_that_node_will_do(tmp_path: Path, mode: tuple[str, ...]) -> None:
    """Node 1's dry run (nothing starts: node 0 need not run) shows its place, and that the output dir and the console
    ranks are node 0's: it showed an output dir of its own, which it never uses, and console ranks [0], whose output
    its console never shows. In a multirun, each job's rendezvous is a port node 0 chooses, not master_port (the
    sweep's store), which the dry run showed."""
    port = free_port()
    own, environ = _explicit(port, 1)
    node = _node(tmp_path, [*mode, "platform.n_nodes=2", "platform.n_procs_per_node=2", "hydra.launcher.dry_run=true",
                            *own], environ)
    out, err = node.communicate(timeout=60)
    assert node.returncode == 0, err
    assert "node            : 1 of 2, rank(s) 2-3; it takes node 0's config, output dir and task as it joins" in out
    assert "console ranks   : none (this node's among platform.console_ranks, node 0's value)\n" in out, out
    assert "rank logs       : node 0's output dir (its dry run shows it)/rank_<rank>.log" in out, out
    assert str(tmp_path) not in out, out
    rendezvous = f"{HOST} (a free port, node 0 chooses as each job starts)" if mode else f"{HOST}:{port}"
    assert f"rendezvous      : tcp://{rendezvous}\n" in out, out


def _can_mount() -> bool:
    """Whether a process can be started here in a mount namespace of its own (root, `unshare`)."""
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.subprocess
@pytest.mark.skipif(not _can_mount(), reason="needs a mount namespace of the test's own (root)")
@pytest.mark.parametrize("made", [False, True], ids=["cannot-make-it", "cannot-write-in-it"])
def test_a_node_that_cannot_write_into_node_0s_output_dir_says_so_on_both_nodes(tmp_path: Path, made: bool) -> None:
    """Without a shared file system, node 1 writes its ranks' logs into node 0's output dir as its own machine has
    that path; here it is read-only (a mount namespace of node 1's own: a read-only root file system, another user's
    home). It said nothing of its own: node 1 showed a traceback of hydra-ddpw's code (`mkdir`, or its rank starter's
    `open_log`), and node 0 a cause that was not it (`node 1 could no longer be reached`, or `rank 1 failed:
    RankExited: exited with code 1`)."""
    runs, port = tmp_path / "runs", free_port()
    out = runs / "job"
    setup = f"mount -t tmpfs none {runs}{f' && mkdir {out}' if made else ''} && mount -o remount,ro {runs}"
    runs.mkdir()
    nodes = []
    for node in (0, 1):
        own, environ = _explicit(port, node)
        command = [sys.executable, str(APPS / "app.py"), "platform.n_nodes=2", "platform.n_procs_per_node=1",
                   f"hydra.run.dir={out}", *own]
        if node == 1:
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{setup} && exec "$@"', "sh",
                       *command]
        nodes.append(subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL, env=_env(environ)))
    (_, err0), (_, err1) = (proc.communicate(timeout=120) for proc in nodes)
    assert [proc.returncode for proc in nodes] == [1, 1], err0 + err1
    said = f"node 1 cannot write its ranks' logs into the job's output dir {out} on its machine (Read-only file system)"
    assert said in err0 and said in err1, err0 + err1
    assert "Traceback" not in err1, err1


@pytest.mark.subprocess
def test_node_1_started_first_waits_for_node_0(tmp_path: Path) -> None:
    port = free_port()
    nodes = {}
    for node in (1, 0):
        own, environ = _explicit(port, node)
        nodes[node] = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", *own], environ)
        time.sleep(1.5)
    errs = {node: proc.communicate(timeout=120)[1] for node, proc in nodes.items()}
    assert (nodes[0].returncode, nodes[1].returncode) == (0, 0), errs
    assert sorted(seen(job_dirs(tmp_path)[0])) == [0, 1]
    assert json.loads((job_dirs(tmp_path)[0] / "seen_rank_1.json").read_text())["env"]["MASTER_ADDR"] == HOST


@pytest.mark.subprocess
def test_node_0_killed_ends_node_1_naming_it_and_nothing_is_left(tmp_path: Path) -> None:
    zero, one, ranks = _two_running(tmp_path)
    zero.kill()
    zero.communicate(timeout=30)
    _, err1 = one.communicate(timeout=30)
    assert one.returncode == 1, err1
    # Node 1 names node 0 lost (and, when its rank failed first, as its own connection to node 0's store broke, that
    # rank's failure, never "node 0 shows" it); without torch's C++ stacks of calls that found node 0's store gone.
    assert "node 0 could no longer be reached" in err1 and "node 0 shows" not in err1, err1
    assert "TCPStore" not in err1 and "frame #" not in err1, err1
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="every rank to end")


@pytest.mark.subprocess
def test_node_1_killed_ends_node_0_naming_it_within_seconds(tmp_path: Path) -> None:
    """Node 0 counts node 1 lost as its connection closes, not once it heard no beat for 5 s (`SILENT_S`), which is
    left for a machine or a network gone, where nothing closes."""
    zero, one, ranks = _two_running(tmp_path)  # ranks that never notice a peer gone
    started = time.monotonic()
    one.kill()
    one.communicate(timeout=30)
    _, err0 = zero.communicate(timeout=60)
    assert zero.returncode == 1, err0
    assert "node 1 could no longer be reached (its program ended: its connection to node 0 closed)" in err0, err0
    assert time.monotonic() - started < 30
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="every rank to end")


@pytest.mark.subprocess
def test_node_1_killed_while_node_0s_rank_waits_for_it_in_a_collective_ends_node_0_naming_it(tmp_path: Path) -> None:
    """Node 0's rank fails at once on the lost peer, and node 0 waits no longer for the end of a node it no longer
    hears."""
    zero, one, ranks = _two_running(tmp_path, behaviour="hold_up")  # rank 1 (node 1) loads, rank 0 waits in all_reduce
    started = time.monotonic()
    one.kill()
    one.communicate(timeout=30)
    _, err0 = zero.communicate(timeout=60)
    assert zero.returncode == 1 and "node 1 could no longer be reached" in err0, err0
    assert time.monotonic() - started < 15  # (it waited for node 1's end for 30 s)
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="every rank to end")


@pytest.mark.subprocess
def test_a_node_whose_ranks_failed_only_as_a_peer_went_away_says_so(tmp_path: Path) -> None:
    """Rank 1 (node 1) fails with gloo's `Connection closed by peer` (its connection to node 0 was lost, or a rank of
    node 0 ended first and node 1's stop came before node 0's): node 1 says so in one line, and exits 1 (it said
    nothing: no rank of its failed by itself, and no other node's stop came). Where node 0's stop (its reaction to
    node 1's) reaches node 1 first, node 1 says it was stopped on node 0, which is true as well."""
    zero, one = _start_two(tmp_path, _explicit, "behaviour=peer_gone", "fail_rank=1")
    _, err0 = zero.communicate(timeout=120)
    _, err1 = one.communicate(timeout=120)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert "[ddpw] rank 1 failed on this node (node 1) only because a peer went away (a rank of another node ended, " \
           "or the network between the nodes failed); node 0 shows the job's error" in err1 \
        or "[ddpw] the job was stopped on node 0, where a rank failed or the time limit passed" in err1, err1


@pytest.mark.subprocess
def test_a_rank_of_node_1_that_fails_before_joining_ends_node_0_whose_rank_0_waits_to_join(tmp_path: Path) -> None:
    """Rank 1 (node 1) cannot open its log (a folder is in the way), so it fails before it joins the process group;
    rank 0, the program's own process on node 0, waits for it in torch's C++ rendezvous, where no signal ends it: it is
    killed at the end of the stop's grace, as a rank that never reached its task, without the extra time a rank 0 in
    its task gets to report through Hydra and without a line saying its task did not end (both before: node 0 ended
    5 s later, saying so)."""
    run_dir = tmp_path / "out"
    (run_dir / "rank_1.log").mkdir(parents=True)
    port = free_port()
    base = ["platform.n_nodes=2", "platform.n_procs_per_node=1", f"hydra.run.dir={run_dir}"]
    zero = _node(tmp_path, [*base, *_explicit(port, 0)[0]], {})
    one = _node(tmp_path, [*base, *_explicit(port, 1)[0]], {})
    _, err1 = one.communicate(timeout=60)
    ended = time.monotonic()
    out0, err0 = zero.communicate(timeout=60)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert "rank 1 (node 1) failed: RankExited: exited with code 1 before returning" in err0, err0
    assert "IsADirectoryError" in err1
    assert "did not end in the time it was given" not in err0, err0
    assert time.monotonic() - ended < REPORT_S, err0


@pytest.mark.subprocess
def test_ctrl_c_on_a_node_waiting_for_node_0_ends_it_at_once(tmp_path: Path) -> None:
    own, environ = _explicit(free_port(), 1)
    one = _node(tmp_path, ["platform.n_nodes=2", "platform.n_procs_per_node=1", *own], environ)
    assert one.stderr is not None
    first = one.stderr.readline()  # it says it waits for node 0
    assert first.startswith(f"[ddpw] node 1 is waiting for node 0 at {HOST}:"), first
    started = time.monotonic()
    one.send_signal(signal.SIGINT)
    _, err = one.communicate(timeout=30)
    assert one.returncode == 130 and time.monotonic() - started < 5, err
    assert "c10d" not in err  # torch's client never tried (and logged) a connection


@pytest.mark.subprocess
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_two_nodes_of_gpu_ranks_span_one_job(tmp_path: Path, backend: str) -> None:
    zero, one = _start_two(tmp_path, _on_gpus, f"platform.backend={backend}")
    _, err0 = zero.communicate(timeout=120)
    _, err1 = one.communicate(timeout=120)
    assert (zero.returncode, one.returncode) == (0, 0), err0 + err1
    ranks = seen(job_dirs(tmp_path)[0])
    assert [ranks[r]["device"] for r in (0, 1)] == ["cuda:0", "cuda:0"]  # each node's first (visible) GPU
    assert ranks[0]["all_reduce_world"] == 2.0 and ranks[0]["output_dir"] == ranks[1]["output_dir"]
    assert leftover(ranks) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("way", [
    pytest.param(_explicit, id="cpu-gloo"), ON_GPUS])
def test_a_hang_across_two_nodes_names_the_rank_outside_the_collective_from_the_flight_recorders(
        tmp_path: Path, way: Way) -> None:
    zero, one = _start_two(tmp_path, way, "behaviour=hold_up", "fail_rank=1", "platform.collective_timeout_min=0.1")
    _, err0 = zero.communicate(timeout=180)
    _, err1 = one.communicate(timeout=60)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert "rank 1 (node 1) failed: NotInCollective: rank 0 waited for it in all_reduce" in err0, err0
    [line] = [line for line in err0.splitlines() if line.startswith("  rank 1: NOT IN THE COLLECTIVE")]
    assert "at load_batch (" in line, line
    assert line.endswith("; collectives: last entered all_reduce #2, not all_reduce #3"), line  # flight recorders
    [job] = job_dirs(tmp_path)
    assert (job / "fr_rank_0").stat().st_size > 0  # (with NCCL, its own dump on the timeout) in the job's output dir
    assert "the job was stopped on node 0" in err1, err1
    assert leftover(seen(job)) == []


# ----------------------------------------------------------------------- a multirun across two nodes
def _sweep_dirs(tmp_path: Path) -> list[Path]:
    return [job for job in job_dirs(tmp_path) if (job / "seen_rank_0.json").exists()]


@pytest.mark.subprocess
@pytest.mark.parametrize("way", [pytest.param(_explicit, id="explicit"), pytest.param(_skypilot, id="skypilot"),
                                 ON_GPUS])
def test_a_multirun_spans_two_nodes_job_by_job_and_every_node_ends_with_the_sweep(tmp_path: Path, way: Way) -> None:
    """The same `-m` command on both nodes: node 0 runs the sweep (its output dirs, its `${now:}`), node 1 runs its
    ranks of each job in turn and ends when node 0's sweep has ended."""
    zero, one = _start_two(tmp_path, way, "-m", "fail_rank=0,1")
    out0, err0 = zero.communicate(timeout=180)
    out1, err1 = one.communicate(timeout=180)
    assert (zero.returncode, one.returncode) == (0, 0), err0 + err1
    jobs = _sweep_dirs(tmp_path)
    assert len(jobs) == 2
    for job in jobs:
        ranks = seen(job)
        assert sorted(ranks) == [0, 1] and ranks[0]["all_reduce_world"] == 2.0
        assert ranks[0]["output_dir"] == ranks[1]["output_dir"] == str(job)  # node 0's dir, on node 1 too
        assert [ranks[r]["env"]["GROUP_RANK"] for r in (0, 1)] == ["0", "1"]
        assert leftover(ranks) == []
    assert len({seen(job)[1]["run_id"] for job in jobs}) == 2  # two jobs, not one run twice
    summary = json.loads((jobs[0].parent / "sweep_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["COMPLETED", "COMPLETED"]
    assert "COMPLETED" in out0 and "COMPLETED" not in out1  # the jobs' reports are on node 0's console
    after_first = err1.partition("every rank of this node (node 1) returned")[2]
    assert after_first and "is waiting for node 0" not in after_first, err1  # node 0 serves each job's store at once
    assert err1.endswith("[ddpw] node 0's sweep ended; this node (node 1) ran its ranks of 2 job(s); node 0 shows the "
                         "sweep's summary\n"), err1  # (it ended saying nothing of the sweep)


@pytest.mark.subprocess
def test_a_failure_on_node_1_in_a_multirun_ends_the_sweep_on_both_nodes(tmp_path: Path) -> None:
    zero, one = _start_two(tmp_path, _explicit, "-m", "behaviour=raise", "fail_rank=1,0",
                           "hydra.launcher.fail_fast=true")
    _, err0 = zero.communicate(timeout=180)
    _, err1 = one.communicate(timeout=180)
    assert (zero.returncode, one.returncode) == (1, 1), err0 + err1
    assert "rank 1 (node 1) failed: ValueError: rank asked to fail" in err0, err0
    # Hydra ends a sweep that raised without `on_multirun_end`: node 0 still says the sweep ended, before its store goes
    assert "node 0's sweep ended with an error: a job failed or a callback raised there, or it was stopped" in err1
    assert "without saying so" not in err1 and "TCPStore" not in err1, err1
    assert len(_sweep_dirs(tmp_path)) == 1  # the sweep stopped at its first failed job (`fail_fast`)


@pytest.mark.subprocess
@pytest.mark.parametrize("pressed", [0, 1], ids=["node-0", "node-1"])
def test_ctrl_c_on_either_node_in_a_multirun_ends_the_sweep_on_both_and_the_other_says_so_once(
    tmp_path: Path, pressed: int
) -> None:
    zero, one, ranks = _two_running(tmp_path, "-m", "fail_rank=0,1")
    got, other = (zero, one) if pressed == 0 else (one, zero)
    got.send_signal(signal.SIGINT)
    _, err_got = got.communicate(timeout=60)
    _, err_other = other.communicate(timeout=60)
    assert got.returncode == 130, err_got
    assert other.returncode == 1, err_other
    if pressed == 1:  # (node 0 shows the job's report)
        assert "[ddpw] node 1 got Ctrl-C (SIGINT), which ends the job on every node; this node's ranks were stopped" \
               in err_got, err_got
    assert err_other.count(f"node {pressed} got Ctrl-C (SIGINT)") == 1, err_other
    assert "could no longer be reached" not in err_other and "ended without saying so" not in err_other, err_other
    assert len(_sweep_dirs(tmp_path)) == 1  # no second job started
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="every rank to end")


@pytest.mark.subprocess
def test_a_second_process_started_as_a_node_of_a_multirun_is_refused_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """As node 1 again (refused only as it joined the running job, it had counted as node 1 in node 0's sweep, and its
    leaving counted node 1 as gone from the sweep: node 0 no longer heard whether the real node 1 was lost between
    jobs, nor waited for it to read the sweep's end), or as node 2 of 3 where node 0's sweep has 2 nodes: refused as
    it reaches node 0's sweep, and the sweep goes on."""
    zero, one, ranks = _two_running(tmp_path, "-m", "fail_rank=0,1")
    port = int(str(zero.args).split("platform.master_port=")[1].split("'")[0])  # (the sweep's store)
    for node, n_nodes, said in (
            (1, 2, f"node 1 already follows node 0's sweep at {HOST}:{port}: another process runs as node 1"),
            (2, 3, f"node 2 is not a node of node 0's sweep at {HOST}:{port}, which runs on 2 node(s)")):
        own, environ = _explicit(port, node)
        again = _node(tmp_path, ["-m", f"platform.n_nodes={n_nodes}", "platform.n_procs_per_node=1", "fail_rank=0,1",
                                 *own], environ)
        _, err = again.communicate(timeout=60)
        assert again.returncode == 1 and said in err, err
    assert (zero.poll(), one.poll()) == (None, None)  # the sweep goes on, untouched
    zero.send_signal(signal.SIGINT)
    _, err0 = zero.communicate(timeout=60)
    _, err1 = one.communicate(timeout=60)
    assert (zero.returncode, one.returncode) == (130, 1), err0 + err1
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="every rank to end")


@pytest.mark.subprocess
def test_an_optuna_study_across_two_nodes_runs_every_trial_on_both(tmp_path: Path) -> None:
    """Node 0's Optuna sweeper decides each trial (4, 2 per batch); node 1 runs its rank of each as it comes."""
    zero, one = _start_two(tmp_path, _explicit, "-m", app="sweep_app.py")
    out0, err0 = zero.communicate(timeout=240)
    _, err1 = one.communicate(timeout=240)
    assert (zero.returncode, one.returncode) == (0, 0), err0 + err1
    jobs = job_dirs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1", "2", "3"]
    for job in jobs:
        ranks = seen(job)
        assert sorted(ranks) == [0, 1] and {r["world_size"] for r in ranks.values()} == {2}
    best = min((seen(job)[0] for job in jobs), key=lambda trial: trial["value"])
    assert f"Best value: {best['value']}" in out0 + err0  # rank 0's value, never the other node's decoy


@pytest.mark.subprocess
def test_node_0_killed_in_a_multirun_ends_node_1_naming_it_and_nothing_is_left(tmp_path: Path) -> None:
    zero, one, ranks = _two_running(tmp_path, "-m", "fail_rank=0,1")
    zero.kill()
    zero.communicate(timeout=30)
    _, err1 = one.communicate(timeout=60)
    assert one.returncode == 1, err1
    assert "node 0's sweep ended without saying so" in err1, err1
    assert "TCPStore" not in err1 and "frame #" not in err1, err1  # (torch's C++ stacks of calls to a store gone)
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="every rank to end")


@pytest.mark.subprocess
def test_node_1_killed_in_a_multirun_ends_the_sweep_naming_it_and_starts_no_more_jobs(tmp_path: Path) -> None:
    """Each further job would wait its join timeout for the lost node: node 0 starts none."""
    zero, one, ranks = _two_running(tmp_path, "-m", "fail_rank=0,1,2", "platform.join_timeout_min=0.5")
    started = time.monotonic()
    one.kill()
    _, err1 = one.communicate(timeout=30)
    out0, err0 = zero.communicate(timeout=120)
    assert zero.returncode == 1, err0
    assert "no more jobs start, since each would wait for a node that job #0 lost: node 1 could no longer be " \
           "reached" in err0, out0 + err0 + err1
    assert time.monotonic() - started < 25  # (jobs #1 and #2 waited 30 s each for node 1)
    summary = json.loads((_sweep_dirs(tmp_path)[0].parent / "sweep_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["FAILED", "NOT STARTED", "NOT STARTED"]
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="every rank to end")


@pytest.mark.subprocess
def test_node_1_killed_between_two_jobs_of_a_multirun_ends_the_next_job_at_once_naming_it(tmp_path: Path) -> None:
    """Node 1 is killed once its ranks of job #0 returned, before it joins job #1: node 0's sweep hears its beats stop
    and ends job #1, which waited for it to join, within seconds (it waited its whole join timeout, then said node 1
    never joined)."""
    zero, one = _start_two(tmp_path, _explicit, "-m", "fail_rank=0,1", "platform.join_timeout_min=2")
    assert one.stderr is not None
    line = one.stderr.readline()
    while line and "every rank of this node (node 1) returned" not in line:
        line = one.stderr.readline()
    assert line, one.communicate()[1]
    started = time.monotonic()
    one.kill()
    one.communicate(timeout=30)
    out0, err0 = zero.communicate(timeout=60)
    assert zero.returncode == 1, err0
    assert "node 1 could no longer be reached (its program ended: its connection to node 0 closed)" in err0, err0
    assert time.monotonic() - started < 40  # (not the join timeout, 120 s)
    summary = json.loads((_sweep_dirs(tmp_path)[0].parent / "sweep_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["COMPLETED", "FAILED"]


@pytest.mark.subprocess
@pytest.mark.parametrize(("zero_flags", "one_flags", "said"), [
    pytest.param(["-m", "fail_rank=0,1"], [], "node 0 (at {where}) runs a multirun (-m) and node 1 a plain run",
                 id="node-1-plain"),
    pytest.param([], ["-m", "fail_rank=0,1"], "node 0 (at {where}) runs a plain run and node 1 a multirun (-m)",
                 id="node-1-multirun"),
])
def test_a_node_whose_command_is_not_node_0s_says_so_at_once(tmp_path: Path, zero_flags: list, one_flags: list,
                                                              said: str) -> None:
    """Node 1 says so at once, and tells node 0, whose job (waiting for node 1 to join) ends at once too, saying the
    same, rather than waiting its whole join timeout (30 minutes) for a node that never joins."""
    port = free_port()
    common = ["platform.n_nodes=2", "platform.n_procs_per_node=1"]
    zero = _node(tmp_path, [*zero_flags, *common, *_explicit(port, 0)[0]], {})
    time.sleep(1.5)
    one = _node(tmp_path, [*one_flags, *common, *_explicit(port, 1)[0]], {})
    _, err1 = one.communicate(timeout=60)
    expected = said.format(where=f"{HOST}:{port}")
    assert one.returncode == 1 and expected in err1, err1
    out0, err0 = zero.communicate(timeout=60)
    assert zero.returncode == 1 and expected in out0 + err0, out0 + err0
