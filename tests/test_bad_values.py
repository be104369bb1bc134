"""Every bad platform value, and every bad launcher option, is refused before anything starts: exit
code 1, no rank, one line naming the key, the value and the fix, no traceback.

Three tables:

- what a user types (`python app.py ...`), one row per kind of bad value: a key that does not exist
  added with `+`, a device or backend this machine or this torch does not have, a timeout torch cannot
  count, an `upon_finish` module that fails to import, a port this program may not listen on. Each
  row runs the test app as a user does and checks that no rank wrote its `seen_rank_*.json`;
- `Wrapper(Platform(...))`, one row per field of `Platform` (the rows of tests/test_validation.py,
  one per key, and the machine checks), in this process: it must raise before anything starts;
- the launcher options, one row per option of both launchers, as every launcher reads them;

and the SLURM launcher's checks before anything is submitted, on configs composed as Hydra composes them.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ddpw_conf import ConfigError, Platform
from ddpw_conf.launcher import LOCAL_LAUNCHER, SLURM_LAUNCHER, LocalLauncherConf, SlurmLauncherConf, selected_options
from ddpw_runtime import Wrapper, wrapper
from ddpw_runtime.launch.checks import check_not_under_torchrun
from ddpw_runtime.launch.rendezvous import unprivileged_ports
from tests.helpers import APPS, job_dirs, run_app, run_python, seen
from tests.test_validation import BAD

DOCS = Path(__file__).parent.parent / "docs"
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"
"""Hydra's own line under every error it reports."""


def mps_here() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


def gpus_here() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def mpi_here() -> bool:
    import torch.distributed as dist

    return bool(dist.is_mpi_available())


def refused(output: str, key: str, value: Any, fix: str) -> None:
    """`output` is one line (besides Hydra's hint) naming `key`, `value` and a fix that has `fix`."""
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith(HYDRA_HINT)]
    assert len(lines) == 1, output
    assert lines[0].startswith(f"{key}={value!r}: "), output
    assert fix in lines[0], output


def nothing_started(root: Path) -> None:
    assert not list(root.rglob("seen_rank_*.json")), "a rank ran"
    assert not list(root.rglob("rank_*.log")), "a rank was started"


# ------------------------------------------------------------------------------- what a user types
TYPED = [
    pytest.param(["+platform.n_proc_per_node=4"], "platform.n_proc_per_node", 4,
                 "did you mean n_procs_per_node?", id="typo-added-with-plus"),
    pytest.param(["+platform.foo=1"], "platform.foo", 1, "Platform has no such field; its fields are backend",
                 id="unknown-key-added-with-plus"),
    pytest.param(["platform.n_proc_per_node=4"], "platform.n_proc_per_node", 4, "did you mean n_procs_per_node?",
                 id="typo-without-plus"),  # (not Hydra's "To append to your config use +", which would then be refused)
    pytest.param(["platform.layout.expert=2"], "platform.layout.expert", 2, "Layout has no such field",
                 id="unknown-nested-key-without-plus"),
    pytest.param(["+platform.layout.expert=2"], "platform.layout.expert", 2,
                 "Layout has no such field; its fields are data, pipeline, tensor", id="unknown-nested-key"),
    pytest.param(["+hydra.launcher.stop_grace=2"], "hydra.launcher.stop_grace", 2, "did you mean stop_grace_s?",
                 id="unknown-launcher-option"),
    pytest.param(["hydra.launcher.max_restart=2"], "hydra.launcher.max_restart", 2, "did you mean max_restarts?",
                 id="unknown-launcher-option-without-plus"),  # (it was Hydra's "use +", with no fix)
    pytest.param(["+hydra.launcher.n_cpus_per_node=2"], "hydra.launcher.n_cpus_per_node", 2, "n_cpus_per_node is a "
                 "field of the job's platform: set platform.n_cpus_per_node instead (under `platform:` in the config, "
                 "not `hydra: launcher:`)", id="platform-field-as-a-launcher-option"),  # (its known options, no more)
    pytest.param(["+n_procs_per_node=3"], "n_procs_per_node", 3, "a field of the job's platform, read from "
                 "platform.n_procs_per_node (here 2), not from the config's top level: move it under `platform:`",
                 id="platform-field-at-the-top-level"),  # (the `platform:` line forgotten: it ran 2 ranks, silently)
    pytest.param(["platform.device=mps"], "platform.device", "mps", "no MPS device", id="mps-not-here"),
    pytest.param(["hydra/launcher=ddpw_mps"], "platform.device", "mps", "use platform.device=cpu",
                 id="ddpw_mps-not-here"),
    pytest.param(["platform.backend=mpi"], "platform.backend", "mpi", "built without mpi; use backend=gloo",
                 id="mpi-not-built"),
    pytest.param(["platform.device=gpu"], "platform.device", "gpu", "CUDA is not available on this machine (no GPU "
                 "found); use platform.device=cpu", id="gpu-not-here"),  # (first: not n_gpus_per_node=0's fix)
    pytest.param(["hydra/launcher=ddpw_gpu", "platform.device=cpu"], "platform.device", "cpu",
                 "hydra/launcher=ddpw_gpu runs the ranks on GPU, but the job's platform says device=cpu, set in your "
                 "config over the launcher's (a Platform in a structured config of yours sets every field): set "
                 "platform.device=gpu there or on the command line, or choose hydra/launcher=ddpw_cpu",
                 id="gpu-launcher-on-a-cpu-platform"),  # (the ranks ran on CPU)
    pytest.param(["platform.device=slurm"], "platform.device", "slurm", "hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps "
                 "runs the ranks on this machine and submits nothing to SLURM; use platform.device=cpu, gpu or mps "
                 "here, or submit to SLURM nodes with python train.py -m hydra/launcher=ddpw_slurm",
                 id="slurm-device-on-a-local-launcher"),  # (the ranks ran here)
    pytest.param(["platform.collective_timeout_min=1e13"], "platform.collective_timeout_min", 1e13,
                 "at most 52560000 minutes", id="collective-timeout-too-long"),
    pytest.param(["platform.collective_timeout_min=1e-9"], "platform.collective_timeout_min", 1e-9,
                 "whole milliseconds", id="collective-timeout-below-1ms"),
    pytest.param(["platform.stop_on_stall=true"], "platform.stop_on_stall", True,
                 "platform.stall_timeout_min set", id="stop_on_stall-without-stall_timeout_min"),
    pytest.param(["platform.n_nodes=2", "platform.node_rank=1"], "platform.master_addr", None,
                 "needs each machine's node rank and node 0's address", id="across-machines-without-node-0s-address"),
    pytest.param(["+platform=written_as_a_whole_config"], "platform.platform", {"n_procs_per_node": 2},
                 "a preset in conf/platform/ is placed under platform already (its config group), so its fields go "
                 "at the file's top level; drop its `platform:` line", id="preset-with-platform-at-its-top"),
    pytest.param(["platform.n_cpus_per_node='2'"], "platform.n_cpus_per_node", "2",
                 "this is a string, not a number: write it unquoted (2, not '2')", id="number-given-as-a-string"),
    pytest.param(["hydra.launcher.interrupt_grace_s=soon"], "hydra.launcher.interrupt_grace_s", "soon",
                 "use a number of seconds >= 0", id="launcher-option-of-the-wrong-type"),  # (not OmegaConf's, no fix)
    pytest.param(["hydra.launcher.platform_key=platfrom"], "hydra.launcher.platform_key", "platfrom",
                 "the job's config has no such node; did you mean platform?", id="platform_key-no-such-node"),
    pytest.param(["hydra.launcher.platform_key=platfrom", "hydra.launcher.dry_run=true"],
                 "hydra.launcher.platform_key", "platfrom", "its top-level nodes are behaviour, fail_rank, freezer, "
                 "platform", id="platform_key-no-such-node-dry-run"),
    pytest.param(["platform.master_addr=no.such.host.invalid"], "platform.master_addr", "no.such.host.invalid",
                 "cannot resolve it", id="master_addr-unresolvable"),
    pytest.param(["hydra.launcher.resume=true"], "hydra.launcher.resume", True,
                 "a plain run is one job, not a sweep to go on with: resume a sweep with -m", id="resume-a-plain-run"),
    pytest.param(["platform.timeout_min=${oc.env:DDPW_TEST_NOT_SET}"], "platform.timeout_min",
                 "${oc.env:DDPW_TEST_NOT_SET}", "cannot be resolved (KeyError raised while resolving interpolation: "
                 "\"Environment variable 'DDPW_TEST_NOT_SET' not found\"): set what it refers to, or give the value "
                 "itself", id="interpolation-that-fails"),  # (it was a traceback of 95 lines through hydra-ddpw)
    pytest.param(["hydra.launcher.stop_grace_s=${oc.env:DDPW_TEST_NOT_SET}"], "hydra.launcher.stop_grace_s",
                 "${oc.env:DDPW_TEST_NOT_SET}", "cannot be resolved (KeyError raised while resolving interpolation",
                 id="launcher-option-interpolation-that-fails"),  # (a traceback through hydra-ddpw)
    pytest.param(["platform.n_procs_per_node=???"], "platform.n_procs_per_node", "???", "the value is missing: give "
                 "one, such as platform.n_procs_per_node=... on the command line", id="missing-value"),
    # OmegaConf keeps the value under a `???` it merges: the launcher option's default filled the preset's mark (it ran)
    pytest.param(["+platform=cpus_must_be_given"], "platform.n_cpus_per_node", "???", "the value is missing: "
                 "platform/cpus_must_be_given.yaml marks it mandatory (???) and nothing gives it (the launcher's "
                 "default does not count); give one, such as platform.n_cpus_per_node=... on the command line",
                 id="missing-value-marked-in-a-preset"),
    pytest.param(["platform.upon_finish=raises_on_import:done"], "platform.upon_finish", "raises_on_import:done",
                 "importing raises_on_import raised RuntimeError: this module fails as it is imported",
                 id="upon_finish-module-raises"),
]


@pytest.mark.subprocess
@pytest.mark.parametrize("overrides, key, value, fix", TYPED)
def test_a_bad_value_typed_by_a_user_is_refused_before_any_rank_starts(
    tmp_path: Path, overrides: list[str], key: str, value: Any, fix: str
) -> None:
    if "mps" in " ".join(overrides) and mps_here():
        pytest.skip("this machine has an MPS device")
    if "mpi" in " ".join(overrides) and mpi_here():
        pytest.skip("this torch has MPI")
    if "device=gpu" in " ".join(overrides) and gpus_here():
        pytest.skip("this machine has a CUDA GPU")
    proc = run_app(tmp_path, "platform.n_procs_per_node=2", *overrides)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, key, value, fix)
    nothing_started(tmp_path)


@pytest.mark.subprocess
@pytest.mark.parametrize("override, key, value, fix", [
    pytest.param("+platform.n_proc_per_node=4", "platform.n_proc_per_node", 4, "did you mean n_procs_per_node?",
                 id="typo-added-with-plus"),
    pytest.param("+platform.layout.expert=2", "platform.layout.expert", 2, "Layout has no such field",
                 id="unknown-nested-key"),
    pytest.param("hydra.launcher.platform_key=platfrom", "hydra.launcher.platform_key", "platfrom",
                 "no such node; did you mean platform?", id="platform_key-no-such-node"),
    pytest.param("hydra.launcher.stop_grace=2", "hydra.launcher.stop_grace", 2, "did you mean stop_grace_s?",
                 id="unknown-launcher-option-without-plus"),
    pytest.param("hydra.launcher.max_parallel_jobs=two", "hydra.launcher.max_parallel_jobs", "two",
                 "use an integer >= 1", id="launcher-option-of-the-wrong-type"),
    pytest.param("hydra.launcher.max_parallel_jobs=${oc.env:DDPW_TEST_NOT_SET}", "hydra.launcher.max_parallel_jobs",
                 "${oc.env:DDPW_TEST_NOT_SET}", "cannot be resolved", id="launcher-option-interpolation-that-fails"),
    pytest.param("+platform=cpus_must_be_given", "platform.n_cpus_per_node", "???",
                 "platform/cpus_must_be_given.yaml marks it mandatory (???)", id="missing-value-marked-in-a-preset"),
    pytest.param("platform.master_addr=127.0.0.1,no.such.host.invalid", "platform.master_addr",
                 "no.such.host.invalid", "cannot resolve it", id="master_addr-of-a-later-job-unresolvable"),
    pytest.param("+collective_timeout_min=1,5", "collective_timeout_min", 1, "not from the config's top level",
                 id="platform-field-at-the-top-level"),
    # Side by side, their rank logs would mix and one rank's flight-recorder file could vanish under the other's
    # (`FileNotFoundError` as a rank started, which failed its job).
    pytest.param("hydra.sweep.subdir=.", "hydra.sweep.subdir", ".", "jobs #0 and #1 of the sweep would run in the same "
                 "output dir", id="two-jobs-in-one-output-dir"),
])
def test_a_multirun_refuses_a_bad_value_of_any_job_before_the_first_starts(
    tmp_path: Path, override: str, key: str, value: Any, fix: str
) -> None:
    proc = run_app(tmp_path, "-m", "platform.n_procs_per_node=1,2", override)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, key, value, fix)
    nothing_started(tmp_path)
    assert not list(tmp_path.iterdir()), "the refused sweep left a dir"  # (it left its multirun.yaml and lock)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [[], ["-m"]], ids=["plain", "multirun"])
def test_a_value_the_apps_config_marks_mandatory_must_be_given(tmp_path: Path, mode: list[str]) -> None:
    """`n_procs_per_node: ???` in the app's config, or `max_restarts: ???` under its `hydra: launcher:`: OmegaConf keeps
    the value under a `???` it merges, and the launcher option's node is merged first, so its default filled the
    mark and the run went on (one rank, no restarts). Each must be given; given on the command line, the run goes."""
    proc = run_app(tmp_path, "--config-name", "mandatory", *mode)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, "platform.n_procs_per_node", "???", "the value is missing: mandatory.yaml "
            "marks it mandatory (???) and nothing gives it (the launcher's default does not count); give one, such "
            "as platform.n_procs_per_node=... on the command line or in the config")
    given = "platform.n_procs_per_node=" + ("1,2" if mode else "1")  # (a multirun: two jobs)
    proc = run_app(tmp_path, "--config-name", "mandatory", *mode, given)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, "hydra.launcher.max_restarts", "???", "mandatory.yaml marks it mandatory")
    nothing_started(tmp_path)
    assert not list(tmp_path.iterdir()), "the refused run left a dir"
    proc = run_app(tmp_path, "--config-name", "mandatory", *mode, given, "hydra.launcher.max_restarts=0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [len(seen(job)) for job in job_dirs(tmp_path)] == ([1, 2] if mode else [1])


@pytest.mark.subprocess
def test_an_apps_own_key_named_as_a_platform_field_runs_where_the_platform_agrees(tmp_path: Path) -> None:
    """The fix the refusal of a platform field at the config's top level offers: the app keeps its own key, and the
    platform refers to it."""
    proc = run_app(tmp_path, "+n_procs_per_node=2", "platform.n_procs_per_node=${n_procs_per_node}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [len(seen(job)) for job in job_dirs(tmp_path)] == [2]


@pytest.mark.subprocess
def test_a_multirun_whose_platform_refers_to_a_swept_key_checks_each_jobs_value(tmp_path: Path) -> None:
    """The multirun's own config, which Hydra composes without the sweep's values, is no job's: a platform value that
    refers to a swept key is resolved in each job (it was refused: `platform.n_procs_per_node='${nproc}': cannot be
    resolved (Interpolation key 'nproc' not found)`, though Hydra's basic launcher ran the sweep)."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    proc = run_app(good, "-m", "+nproc=1,2", "platform.n_procs_per_node=${nproc}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [sorted(seen(job)) for job in job_dirs(good)] == [[0], [0, 1]]
    proc = run_app(bad, "-m", "+nproc=1,2,0", "platform.n_procs_per_node=${nproc}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, "platform.n_procs_per_node", 0, "use an integer >= 1")
    nothing_started(bad)


def _without_low_ports() -> None:
    """In the child, before the app starts: drop the right to listen on ports below the unprivileged
    range (root keeps it otherwise), so the app runs as an ordinary user would."""
    pr_capbset_drop, cap_net_bind_service = 24, 10
    if ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, cap_net_bind_service, 0, 0, 0) != 0:
        os._exit(99)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [[], ["-m"]], ids=["plain-run", "multirun"])
def test_a_port_this_program_may_not_listen_on_is_refused_before_any_rank_starts(
    tmp_path: Path, mode: list[str]
) -> None:
    port = unprivileged_ports() - 1
    if port < 1:
        pytest.skip("every port is open to every program on this machine")
    proc = subprocess.run(
        [sys.executable, str(APPS / "app.py"), *mode, "platform.n_procs_per_node=2", f"platform.master_port={port}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        preexec_fn=_without_low_ports if os.geteuid() == 0 else None,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused(proc.stdout + proc.stderr, "platform.master_port", port, f"choose a port of {port + 1} or above")
    nothing_started(tmp_path)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [[], ["-m"]], ids=["plain-run", "multirun"])
def test_a_program_that_torchrun_runs_several_times_is_refused_in_each_copy(tmp_path: Path, mode: list[str]) -> None:
    """`torchrun --nproc_per_node=2 app.py` with a ddpw launcher: each copy started a job of 2 ranks of its own, both in
    the same output dir (each job's rank logs written over the other's)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(APPS / "app.py"), *mode],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert output.count("LOCAL_WORLD_SIZE=2: this program runs under torchrun, as one of 2 copies on this machine, "
                        "and each copy would start ranks of its own; run it once") == 2, output
    nothing_started(tmp_path)


def check_here_as_under_torchrun() -> bool:
    """In a rank: what a program started there (with the rank's variables) would be told."""
    check_not_under_torchrun(os.environ)
    return True


def test_a_program_in_a_rank_of_hydra_ddpws_own_is_not_taken_for_a_copy_torchrun_runs() -> None:
    """A rank's variables are torchrun's (`LOCAL_WORLD_SIZE=2`, `TORCHELASTIC_RUN_ID`), but it names its job: a program
    its task starts (an evaluation script with a ddpw launcher, say) may start ranks of its own."""
    assert Wrapper(Platform(n_procs_per_node=2)).start(check_here_as_under_torchrun) == [True, True]


@pytest.mark.subprocess
def test_hydra_full_error_gives_the_whole_traceback_and_still_starts_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(APPS / "app.py"), "platform.collective_timeout_min=1e-9"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "HYDRA_FULL_ERROR": "1"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("such as 30"), proc.stderr
    nothing_started(tmp_path)


@pytest.mark.subprocess
def test_checking_a_cpu_platform_imports_no_torch() -> None:
    """The checks ask torch only for the platforms that need it (GPUs, MPS, mpi, nccl): the controller of
    a CPU sweep in an app that imports torch only in its task stays light."""
    code = (
        "import sys\n"
        "from ddpw_conf import Platform\n"
        "from ddpw_runtime.launch.checks import check\n"
        "check(Platform(n_procs_per_node=2, upon_finish='gc:collect'))\n"
        "check(Platform(device='slurm', n_nodes=2, n_gpus_per_node=1, backend='mpi'), here=False)\n"
        "print('torch' in sys.modules)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


# ------------------------------------------------------------------------------- Wrapper(Platform(...))
def _first_per_key() -> list[Any]:
    """One row of tests/test_validation.py's table per key (the first), as `Wrapper` gets it."""
    rows: dict[str, Any] = {}
    for bad in BAD:
        if bad.gpus_available is None:
            rows.setdefault(bad.key.split("[")[0], bad)
    return [pytest.param(bad.fields, bad.key, bad.value, bad.hint, id=bad.id) for bad in rows.values()]


def _children() -> set[int]:
    """This process's child processes."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


MACHINE = [
    pytest.param({"device": "mps"}, "platform.device", "mps", "no MPS device", id="mps-not-here"),
    pytest.param({"backend": "mpi"}, "platform.backend", "mpi", "built without mpi", id="mpi-not-built"),
    pytest.param({"n_cpus_per_node": 4096}, "platform.n_cpus_per_node", 4096, "ask for at most",
                 id="more-cores-than-here"),
    pytest.param({"upon_finish": "raises_on_import:done"}, "platform.upon_finish", "raises_on_import:done",
                 "RuntimeError: this module fails as it is imported", id="upon_finish-module-raises"),
    pytest.param({"upon_finish": "json:no_such_function"}, "platform.upon_finish", "json:no_such_function",
                 "has no attribute 'no_such_function'", id="upon_finish-no-such-function"),
    pytest.param({"upon_finish": "json:dumps"}, "platform.upon_finish", "json:dumps", "it is called with no "
                 "arguments, and this one needs some (missing a required argument: 'obj')",
                 id="upon_finish-needs-arguments"),  # (the job failed after its ranks, as it was called)
    pytest.param({"device": "slurm"}, "platform.device", "slurm", "a Wrapper runs the ranks on this machine and "
                 "submits nothing to SLURM; use platform.device=cpu, gpu or mps", id="slurm-device-here"),  # (it ran)
]


@pytest.mark.parametrize("fields_, key, value, fix", _first_per_key() + MACHINE)
def test_wrapper_refuses_a_bad_platform_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields_: dict[str, Any], key: str, value: Any, fix: str
) -> None:
    if fields_.get("device") == "mps" and mps_here():
        pytest.skip("this machine has an MPS device")
    if fields_.get("backend") == "mpi" and mpi_here():
        pytest.skip("this torch has MPI")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(APPS))
    before = _children()
    with pytest.raises(ConfigError) as info:
        Wrapper(Platform(**fields_))
    assert info.value.key == key and info.value.value == value
    refused(str(info.value), key, value, fix)
    assert _children() <= before, "a process was started"
    assert not list(tmp_path.iterdir()), "a log folder was made"


UNTYPED: Any = Wrapper
"""`Wrapper` as a script without type checks calls it."""
UNTYPED_DECORATOR: Any = wrapper
"""`wrapper` likewise."""


def _a_task() -> None:
    """A task function, given to a bare `@wrapper`."""


@pytest.mark.parametrize("call, key, value, fix", [
    pytest.param(lambda: UNTYPED({"n_procs_per_node": 2}), "Wrapper.platform",
                 {"n_procs_per_node": 2}, "give a Platform (from ddpw_runtime import Platform), such as "
                 "Platform(**that_mapping)", id="platform-a-dict"),
    pytest.param(lambda: UNTYPED("cpu"), "Wrapper.platform", "cpu", "such as Platform(n_procs_per_node=2)",
                 id="platform-a-string"),
    pytest.param(lambda: UNTYPED(Platform(n_procs_per_node=2), task_context=5), "Wrapper.task_context", 5,
                 "give a function of no arguments that returns a context manager", id="task_context-not-callable"),
    pytest.param(lambda: UNTYPED(Platform(n_procs_per_node=2), caller_rank="yes"), "Wrapper.caller_rank", "yes",
                 "use true or false", id="caller_rank-not-a-bool"),
    pytest.param(lambda: UNTYPED(Platform(n_procs_per_node=2), log_dir=__file__), "Wrapper.log_dir", __file__,
                 "give a folder", id="log_dir-a-file"),
    pytest.param(lambda: UNTYPED(Platform(n_procs_per_node=2)).start("notcallable"), "Wrapper.start(target)",
                 "notcallable", "give the function every rank calls", id="start-not-callable"),
    pytest.param(lambda: UNTYPED_DECORATOR(_a_task), "wrapper(platform)", "_a_task",
                 "@wrapper(Platform(n_procs_per_node=2)) above the function, not a bare @wrapper", id="bare-decorator"),
    pytest.param(lambda: UNTYPED_DECORATOR(Platform(n_procs_per_node=2))(5), "wrapper(platform)(function)", 5,
                 "decorate the function every rank calls", id="decorating-not-callable"),
])
def test_wrapper_refuses_an_argument_of_the_wrong_kind_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any], key: str, value: Any, fix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    before = _children()
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key == key and info.value.value == value
    refused(str(info.value), key, value, fix)
    assert _children() <= before, "a process was started"
    assert not list(tmp_path.iterdir()), "a log folder was made"


def test_wrapper_refuses_a_port_another_program_listens_on() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            Wrapper(Platform(n_procs_per_node=2, master_port=port))
    refused(str(info.value), "platform.master_port", port, "another program is listening on this port")


def test_every_field_of_platform_has_a_row() -> None:
    covered = {param.values[1].split(".")[1] for param in _first_per_key() + MACHINE}
    assert covered == {f.name for f in fields(Platform)}


# ------------------------------------------------------------------------------- launcher options
OPTIONS = [
    # both launchers
    ({"dry_run": "yes"}, "hydra.launcher.dry_run", "use true or false"),
    ({"stop_grace_s": -5}, "hydra.launcher.stop_grace_s", "number of seconds >= 0"),
    ({"stop_grace_s": float("nan")}, "hydra.launcher.stop_grace_s", "number of seconds >= 0"),  # (it ran)
    ({"interrupt_grace_s": "soon"}, "hydra.launcher.interrupt_grace_s", "number of seconds >= 0"),
    ({"interrupt_grace_s": 1e12}, "hydra.launcher.interrupt_grace_s", "at most 3153600000 seconds (100 years)"),
    ({"max_restarts": -1}, "hydra.launcher.max_restarts", "integer >= 0"),
    ({"platform_key": "hydra.x"}, "hydra.launcher.platform_key", "name a node of the job's config"),
    ({"resume": "yes"}, "hydra.launcher.resume", "use true or false"),
    ({"fail_fast": 2}, "hydra.launcher.fail_fast", "use true or false"),
    ({"stop_grace": 2}, "hydra.launcher.stop_grace", "did you mean stop_grace_s?"),
    # the local launchers
    ({"max_parallel_jobs": 0, "_target_": LOCAL_LAUNCHER}, "hydra.launcher.max_parallel_jobs", "integer >= 1"),
    ({"max_paralel_jobs": 2, "_target_": LOCAL_LAUNCHER}, "hydra.launcher.max_paralel_jobs",
     "did you mean max_parallel_jobs?"),
    ({"qos": "high", "_target_": LOCAL_LAUNCHER}, "hydra.launcher.qos",
     "qos is an option of hydra/launcher=ddpw_slurm only: select that launcher, or drop it"),  # (not said)
    # the SLURM launcher
    ({"fire_and_forget": 1, "_target_": SLURM_LAUNCHER}, "hydra.launcher.fire_and_forget", "use true or false"),
    ({"submitit_folder": "logs/%A_%a", "_target_": SLURM_LAUNCHER}, "hydra.launcher.submitit_folder", "%j"),
    ({"qos": "high --wrap=x", "_target_": SLURM_LAUNCHER}, "hydra.launcher.qos", "single SLURM value"),
    ({"account": "-A other", "_target_": SLURM_LAUNCHER}, "hydra.launcher.account", "single SLURM value"),
    ({"constraint": "a100 b", "_target_": SLURM_LAUNCHER}, "hydra.launcher.constraint", "single SLURM value"),
    ({"exclude": "n1\nn2", "_target_": SLURM_LAUNCHER}, "hydra.launcher.exclude", "single SLURM value"),
    ({"setup": "module load cuda", "_target_": SLURM_LAUNCHER}, "hydra.launcher.setup", "a list of shell lines"),
    ({"array_parallelism": 0, "_target_": SLURM_LAUNCHER}, "hydra.launcher.array_parallelism", "integer >= 1"),
    ({"signal_delay_s": 0, "_target_": SLURM_LAUNCHER}, "hydra.launcher.signal_delay_s", "integer >= 1"),
    ({"qos_name": "high", "_target_": SLURM_LAUNCHER}, "hydra.launcher.qos_name", "did you mean qos?"),
]


@pytest.mark.parametrize("options, key, fix", OPTIONS, ids=[key.rpartition(".")[2] for _, key, _ in OPTIONS])
def test_a_bad_launcher_option_is_refused(options: dict[str, Any], key: str, fix: str) -> None:
    targets = [options["_target_"]] if "_target_" in options else [LOCAL_LAUNCHER, SLURM_LAUNCHER]
    for target in targets:
        with pytest.raises(ConfigError) as info:
            selected_options({**options, "_target_": target})  # what every launcher reads its options with
        value = options[key.rpartition(".")[2]]
        assert info.value.key == key and info.value.value is value  # (`is`: NaN equals nothing)
        refused(str(info.value), key, value, fix)


def test_every_launcher_option_has_a_row() -> None:
    covered = {key.rpartition(".")[2] for _, key, _ in OPTIONS}
    options = {f.name for kind in (LocalLauncherConf, SlurmLauncherConf) for f in fields(kind)} - {"_target_"}
    assert options <= covered


# ------------------------------------------------------------------------------- SLURM, before submitting
@pytest.mark.parametrize("override, key, value, fix", [
    pytest.param("+platform.n_proc_per_node=4", "platform.n_proc_per_node", 4, "did you mean n_procs_per_node?",
                 id="typo-added-with-plus"),
    pytest.param("+platform.layout.expert=2", "platform.layout.expert", 2, "Layout has no such field",
                 id="unknown-nested-key"),
    pytest.param("platform.collective_timeout_min=1e-9", "platform.collective_timeout_min", 1e-9,
                 "whole milliseconds", id="collective-timeout-below-1ms"),
    pytest.param("platform.timeout_min=1e13", "platform.timeout_min", 1e13, "at most 52560000 minutes",
                 id="time-limit-too-long"),
    pytest.param("platform.upon_finish=raises_on_import:done", "platform.upon_finish", "raises_on_import:done",
                 "RuntimeError: this module fails as it is imported", id="upon_finish-module-raises"),
])
def test_slurm_refuses_a_bad_value_before_submitting(
    monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: Any, override: str, key: str, value: Any, fix: str
) -> None:
    """What the SLURM launcher does with each job before it submits anything (`prepared`, in a plain
    run and a multirun alike), on the config Hydra composes for the test's SLURM app."""
    from ddpw_runtime.hydra_jobs.prepare import prepared

    monkeypatch.syspath_prepend(str(APPS))
    with initialize_config_dir(config_dir=str(APPS / "conf"), version_base=None):
        config = compose(config_name="slurm", overrides=[override], return_hydra_config=True)
    options = selected_options(config.hydra.launcher)
    assert isinstance(options, SlurmLauncherConf)
    with pytest.raises(ConfigError) as info:
        prepared(config, 0, [override], options)
    refused(str(info.value), key, value, fix)


def test_the_docs_example_of_slurm_additional_parameters_is_accepted(
    monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: Any
) -> None:
    from ddpw_runtime.hydra_jobs.prepare import job_check

    row = re.search(r"\| `slurm_additional_parameters` \|.*?e\.g\. `(\{.*?\})`", (DOCS / "platform.md").read_text())
    assert row is not None
    override = f"++platform.slurm_additional_parameters={row.group(1)}"
    monkeypatch.syspath_prepend(str(APPS))
    with initialize_config_dir(config_dir=str(APPS / "conf"), version_base=None):
        config = compose(config_name="slurm", overrides=[override], return_hydra_config=True)
    options = selected_options(config.hydra.launcher)
    assert isinstance(options, SlurmLauncherConf)
    platform = options.platform_of(config)
    job_check(options, platform)  # every check of a job before it is submitted
    assert platform.slurm_additional_parameters == OmegaConf.to_container(OmegaConf.create(row.group(1)))
