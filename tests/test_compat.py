"""Every private API of Hydra, OmegaConf, torch and submitit that `ddpw_runtime._compat` uses, checked
against the installed (pinned) versions, so an upgrade that breaks one fails here first."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from ddpw_runtime import _compat
from ddpw_runtime.errors import RankFailure


def test_hydra_state_round_trips_with_a_resolver_registered_here(hydra_restore_singletons: Any) -> None:
    OmegaConf.register_new_resolver("ddpw_test_twice", lambda text: text * 2, replace=True)
    try:
        state = cloudpickle.dumps(_compat.hydra_state())
    finally:
        OmegaConf.clear_resolver("ddpw_test_twice")
    assert not OmegaConf.has_resolver("ddpw_test_twice")
    _compat.restore_hydra_state(cloudpickle.loads(state))
    try:
        assert OmegaConf.create({"x": "${ddpw_test_twice:ab}"}).x == "abab"
    finally:
        OmegaConf.clear_resolver("ddpw_test_twice")


def test_job_error_reads_a_failed_return_without_raising() -> None:
    error = ValueError("bad")
    assert _compat.job_error(JobReturn(status=JobStatus.FAILED, _return_value=error)) is error
    assert _compat.job_error(JobReturn(status=JobStatus.COMPLETED, _return_value=3)) is None


def test_the_basic_sweepers_target_is_the_one_hydra_configures(hydra_restore_singletons: Any) -> None:
    from hydra import compose, initialize

    with initialize(version_base=None):
        config = compose(return_hydra_config=True)
    assert config.hydra.sweeper._target_ == _compat.BASIC_SWEEPER


def test_a_config_file_is_read_as_hydras_loader_finds_it(tmp_path: Path, hydra_restore_singletons: Any) -> None:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "platform").mkdir()
    (tmp_path / "platform" / "mine.yaml").write_text("# @package _global_\nplatform:\n  n_procs_per_node: ???\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        found = _compat.config_file(loader, "platform/mine")
        assert OmegaConf.to_container(found.config) == {"platform": {"n_procs_per_node": "???"}}
        assert found.header["package"] == "_global_"
        assert _compat.config_file(loader, "platform/none") is None


def test_options_give_a_device_meshs_groups_a_timeout() -> None:
    from datetime import timedelta

    for backend in ("gloo", "nccl"):
        options = _compat.mesh_group_options(backend, timedelta(seconds=7))
        if backend == "nccl" and options is None:  # (a torch built without NCCL: torch's default stands)
            continue
        assert options._timeout == timedelta(seconds=7)


_FINALIZERS_SCRIPT = """
import os, sys, weakref
from ddpw_runtime import _compat

class Held:
    pass

inherited, own = Held(), Held()
weakref.finalize(inherited, print, "inherited")
_compat.disown_finalizers()
weakref.finalize(own, print, "own")
_compat.run_finalizers()  # "own" only: a rank ends with os._exit, which runs none
sys.stdout.flush()
os._exit(0)
"""


def test_finalizers_made_before_are_disowned_and_those_made_since_are_run() -> None:
    proc = subprocess.run([sys.executable, "-c", _FINALIZERS_SCRIPT], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "own\n"), proc.stderr


def test_report_like_hydra_prints_a_compact_error_alone_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert _compat.report_like_hydra(lambda: 7) == 7

    def fail() -> None:
        raise RankFailure(1, 0, 1, "ValueError", "bad batch", "Traceback...\nValueError: bad batch")

    with pytest.raises(SystemExit) as info:
        _compat.report_like_hydra(fail)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("rank 1 (node 0) failed: ValueError: bad batch\n") and "test_compat.py" not in err


def test_an_error_raised_under_run_job_is_reported_from_the_task_on_as_hydra_reports_a_jobs(
        capsys: pytest.CaptureFixture[str]) -> None:
    def task(value: int) -> None:
        raise ValueError(f"bad {value}")

    assert _compat.run_job(lambda value: value + 1, 1) == 2
    with pytest.raises(SystemExit):
        _compat.report_like_hydra(lambda: _compat.run_job(task, 3))
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n") and ", in task\n" in err
    assert "<lambda>" not in err and "run_and_report" not in err and "ValueError: bad 3" in err
    assert "HYDRA_FULL_ERROR=1" in err  # Hydra's own hint: the error went the way of a job's


def test_the_process_group_counter_that_a_failed_init_leaves_can_be_reset() -> None:
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    saved = world.group_count
    world.group_count = 5
    try:
        _compat.forget_failed_process_group()
        assert world.group_count == 0
    finally:
        world.group_count = saved


def test_submitit_renders_the_script_and_exposes_what_the_waiting_reads() -> None:
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    script = _compat.sbatch_script("python -m x", Path("/tmp/ddpw-folder/%j"), None, nodes=2, job_name="j")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --job-name=j" in script
    assert importlib.util.find_spec(_compat.SUBMITIT_ENTRY) is not None
    assert isinstance(SlurmJob.watcher, SlurmInfoWatcher)
    assert "mode" in inspect.signature(SlurmInfoWatcher.get_state).parameters
    assert callable(SlurmInfoWatcher.update)
    assert isinstance(JobPaths.result_pickle, property)


def test_torch_without_gpu_support_is_read_without_importing_torch() -> None:
    code = ("import sys; from ddpw_runtime import _compat; known = _compat.torch_without_gpu_support(); "
            "assert 'torch' not in sys.modules; import torch; "
            "print(known, torch.version.cuda is None and torch.version.hip is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == out[1]


def test_the_import_code_is_on_the_stack_inside_an_import_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ddpw_probe_import.py").write_text("import inspect\nCODES = [i.frame.f_code for i in inspect.stack()]")
    monkeypatch.syspath_prepend(str(tmp_path))
    import ddpw_probe_import  # type: ignore[import-not-found]

    assert _compat.import_code() in ddpw_probe_import.CODES
    assert _compat.import_code() not in [info.frame.f_code for info in inspect.stack()]


def test_report_like_hydra_fails_loudly_when_hydra_no_longer_has_its_reporter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hydra._internal.utils as hydra_utils

    monkeypatch.delattr(hydra_utils, "run_and_report")

    def fail() -> None:
        raise ValueError("platform.x=1: bad")

    with pytest.raises(SystemExit) as info:
        _compat.report_like_hydra(fail)
    assert info.value.code == 1 and "platform.x=1: bad" in capsys.readouterr().err


def test_private_members_of_other_libraries_are_reached_in_compat_only() -> None:
    """ruff's private-member check (SLF001) runs on the whole package but `_compat.py`; this test keeps
    that configuration from being dropped."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    lint = text.split("[tool.ruff.lint]", 1)[1].split("\n[tool.", 1)[0]
    assert '"SLF"' in lint.split("select", 1)[1].splitlines()[0]
    ignores = text.split("[tool.ruff.lint.per-file-ignores]", 1)[1].split("\n[", 1)[0]
    exempt = {line.split("=")[0].strip().strip('"') for line in ignores.splitlines() if "SLF001" in line}
    assert exempt == {"ddpw_runtime/_compat.py", "tests/**"}


_EXIT_SCRIPT = """
import atexit, gzip, io, sys
from ddpw_runtime import _compat

atexit.register(print, "inherited")
_compat.forget_exit_handlers()
atexit.register(print, "own")
_compat.run_exit_handlers()  # "own" only, and once: Python runs none as it exits
text = open(sys.argv[1], "w")
print(len(_compat.open_files([text, text.buffer, gzip.open(sys.argv[1] + ".gz", "wt"), io.BytesIO(), 3, "x"])))
"""


class WarnsAsItIsRead:
    """As torch 2.15's deprecated `torch.distributed.reduce_op`: every attribute read warns, its class too."""

    def __getattribute__(self, key: str) -> object:
        warnings.warn("reading this object is deprecated", FutureWarning, stacklevel=2)
        return object.__getattribute__(self, key)


def test_looking_for_open_files_among_objects_that_warn_as_they_are_read_shows_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compat.open_files([WarnsAsItIsRead(), sys.stdout]) == [sys.stdout]


def test_the_exit_handlers_of_a_fork_are_dropped_and_its_own_run_and_its_open_files_are_found(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path / "file")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "own\n4\n"


_RECORDER_SCRIPT = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d

from ddpw_runtime import _compat

folder = Path(sys.argv[1])
assert _compat.flight_recorder_dump() is None  # no process group yet
dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
dist.all_reduce(torch.ones(1))
dist.barrier()
(folder / "fr_rank_0").write_bytes(_compat.flight_recorder_dump())
del _distributed_c10d._dump_fr_trace  # a torch without it
assert _compat.flight_recorder_dump() is None
"""


def test_the_flight_recorder_of_a_gloo_group_is_dumped_and_read(tmp_path: Path) -> None:
    from ddpw_runtime.launch.recorded import Collective, recorded_in

    proc = subprocess.run([sys.executable, "-c", _RECORDER_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TORCH_FR_BUFFER_SIZE": "20"})
    assert proc.returncode == 0, proc.stderr
    (recorded,) = recorded_in(tmp_path, [0])
    assert recorded.newest == Collective("barrier", 2, "0")
    assert "[ddpw] this torch has no _dump_fr_trace: the hang report names no collectives" in proc.stderr


_STORE_GONE_SCRIPT = """
import subprocess, sys
from datetime import timedelta
from torch.distributed import TCPStore
from ddpw_runtime import _compat
server = subprocess.Popen([sys.executable, "-c", "import sys; from torch.distributed import TCPStore; "
                           "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); "
                           "print(s.port, flush=True); sys.stdin.read()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
client = TCPStore("127.0.0.1", int(server.stdout.readline()), is_master=False, timeout=timedelta(seconds=10))
client.set("key", "1")
if sys.argv[1] == "off":
    assert _compat.cpp_warnings_off()
server.kill()
server.wait()
try:
    client.get("key")
except RuntimeError:
    print("raised")
"""


@pytest.mark.parametrize("warnings", ["on", "off"])
def test_torchs_cpp_warnings_of_a_store_gone_are_stopped_in_this_process_only_when_asked(warnings: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _STORE_GONE_SCRIPT, warnings], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "raised\n", proc.stdout + proc.stderr
    assert ("TCPStore" in proc.stderr) == (warnings == "on"), proc.stderr  # (the store's own error still raises)
