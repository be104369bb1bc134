"""A plain run (no `-m`) with a ddpw launcher is Hydra's own run mode, with the user's process as rank 0.

One test per behaviour a user compares with Hydra's basic launcher. The app (`tests/apps/repo_app.py`,
config `repo.yaml`) is a research repo's training script that knows nothing of hydra-ddpw: its own run
and sweep dirs, its own callbacks, torch imported only inside the task. It is run as a user runs it,
with the command line alone: `python repo_app.py hydra/launcher=ddpw_cpu platform.n_procs_per_node=2`.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import APPS, job_dirs, run_app

pytestmark = pytest.mark.subprocess

LAUNCH = ("hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2")


def run_repo(cwd: Path, *overrides: str, flags: tuple = ()) -> subprocess.CompletedProcess:
    """The repo's script with the ddpw launcher chosen on the command line."""
    return run_app(cwd, *flags, *LAUNCH, *overrides, app="repo_app.py")


def seen(job: Path) -> dict[int, dict]:
    """What each rank of a job reported, by rank."""
    return {int(p.stem.rsplit("_", 1)[1]): json.loads(p.read_text()) for p in job.glob("seen_rank_*.json")}


def events(cwd: Path) -> list[dict]:
    """The callbacks the repo's recorder saw, in order."""
    return [json.loads(line) for line in (cwd / "callback_events.jsonl").read_text().splitlines()]


def test_output_goes_to_the_run_dir_whatever_the_sweep_dir_says(tmp_path: Path) -> None:
    proc = run_repo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert job.relative_to(tmp_path).parts[:3] == ("logs", "train", "runs")  # the repo's hydra.run.dir
    assert sorted(seen(job)) == [0, 1] and {r["world_size"] for r in seen(job).values()} == {2}
    assert (job / ".hydra" / "config.yaml").is_file() and (job / "repo_app.log").is_file()
    assert not list(tmp_path.rglob("multirun.yaml")) and not (tmp_path / "logs" / "train" / "multiruns").exists()
    proc = run_repo(tmp_path, "hydra.run.dir=rd", "hydra.sweep.dir=sw")
    assert proc.returncode == 0, proc.stderr
    assert sorted(seen(tmp_path / "rd")) == [0, 1] and not (tmp_path / "sw").exists()


def test_sweep_syntax_without_m_is_refused_as_hydra_refuses_it(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "+x=1,2")
    assert proc.returncode == 1
    assert "Ambiguous value for argument '+x=1,2'" in proc.stderr
    assert job_dirs(tmp_path) == [] and not list(tmp_path.rglob("rank_*.log"))


@pytest.mark.parametrize("flag, mode", [("-m", ""), ("", "hydra.mode=MULTIRUN")], ids=["-m", "hydra.mode"])
def test_multirun_by_flag_or_by_mode_sweeps_into_the_sweep_dir(tmp_path: Path, flag: str, mode: str) -> None:
    proc = run_repo(tmp_path, "+x=1,2", *[mode] * bool(mode), flags=(flag,) * bool(flag))
    assert proc.returncode == 0, proc.stderr
    jobs = job_dirs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1"]
    assert all(job.relative_to(tmp_path).parts[:3] == ("logs", "train", "multiruns") for job in jobs)
    assert all(sorted(seen(job)) == [0, 1] for job in jobs)
    assert len(list(tmp_path.rglob("multirun.yaml"))) == 1
    names = [e["event"] for e in events(tmp_path)]
    assert names[0] == "on_multirun_start" and names[-1] == "on_multirun_end" and "on_run_start" not in names


def test_a_plain_run_gets_the_run_callbacks_with_the_users_task_and_rank_0s_value(tmp_path: Path) -> None:
    proc = run_repo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = events(tmp_path)
    assert [e["event"] for e in got] == ["on_run_start", "on_job_start", "on_job_end", "on_run_end"]
    assert got[1]["task_function"] == "train"
    assert got[2]["status"] == "COMPLETED" and got[2]["return_value"] == {"rank": 0}
    assert {e["pid"] for e in got} == {seen(job_dirs(tmp_path)[0])[0]["pid"]}  # rank 0 runs Hydra's run


def test_a_failure_of_another_rank_is_the_jobs_failure_when_on_run_end_sees_it(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "behaviour=raise")
    assert proc.returncode == 1
    end = [e for e in events(tmp_path) if e["event"] == "on_run_end"][0]
    assert end["status"] == "FAILED" and "rank 1 (node 0) failed: ValueError" in end["return_value"]


def test_now_is_the_same_in_every_rank_and_hydra_yaml_reads_back(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "platform.n_procs_per_node=3")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert len({r["stamp"] for r in seen(job).values()}) == 1  # ${now:%H-%M-%S-%f}, microseconds
    hydra_yaml = OmegaConf.load(job / ".hydra" / "hydra.yaml")
    assert hydra_yaml.hydra.mode == "RUN"  # a plain value, as Hydra's own run writes it


def _in_terminal(cwd: Path, *overrides: str, answers: bytes = b"", app: str = "repo_app.py") -> tuple:
    """Run the repo's script (or `app`) with a terminal as its stdin, stdout and stderr (as from a shell); type
    `answers` once the program waits for input. Returns (exit code, what the terminal showed)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(APPS / app), *LAUNCH, *overrides], cwd=cwd,
        stdin=terminal, stdout=terminal, stderr=terminal, env={**os.environ, "TERM": "xterm"},
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.5)
        if ready:
            try:
                data = os.read(controller, 65536)
            except OSError:  # the program has exited and closed the terminal
                break
            if not data:
                break
            shown += data
            if answers and b"(Pdb)" in shown:
                os.write(controller, answers)
                answers = b""
        elif proc.poll() is not None:
            break
    os.close(controller)
    return proc.wait(timeout=30), shown.decode(errors="replace")


def test_rank_0_keeps_the_terminal_and_its_log_still_gets_every_line(tmp_path: Path) -> None:
    code, shown = _in_terminal(tmp_path)
    assert code == 0, shown
    (job,) = job_dirs(tmp_path)
    ranks = seen(job)
    assert ranks[0]["stdout_isatty"] and ranks[0]["stderr_isatty"]  # progress bars and colours work
    assert not ranks[1]["stdout_isatty"]  # rank 1 is not shown on the console: it writes its log file
    assert "hello from rank 0" in shown and "hello from rank 0" in (job / "rank_0.log").read_text()
    assert "info record from rank 0" in (job / "rank_0.log").read_text()
    code, shown = _in_terminal(tmp_path, "platform.console_ranks=all")
    assert code == 0, shown
    ranks = seen(job_dirs(tmp_path)[-1])
    assert ranks[1]["stdout_isatty"] and "[rank 1] hello from rank 1" in shown


def test_a_script_beside_a_module_named_as_the_standard_librarys_tty_still_shows_its_ranks(tmp_path: Path) -> None:
    """A script's folder comes first on the import path: a `tty.py` of the user's there shadows the standard library's,
    which the console used to give each shown rank a raw terminal (the run failed with an AttributeError)."""
    project = tmp_path / "project"
    shutil.copytree(APPS / "conf", project / "conf")
    for module in ("repo_app.py", "recorder.py"):
        shutil.copy(APPS / module, project)
    (project / "tty.py").write_text('"""The user\'s own module, named as the standard library\'s."""\n')
    code, shown = _in_terminal(tmp_path, "platform.console_ranks=all", app=str(project / "repo_app.py"))
    assert code == 0, shown
    assert "[rank 1] hello from rank 1" in shown


def test_pdb_in_rank_0_works_in_a_plain_run(tmp_path: Path) -> None:
    code, shown = _in_terminal(tmp_path, "behaviour=pdb", answers=b"p 6 * 7\nc\n")
    assert code == 0, shown
    assert "(Pdb)" in shown and "42" in shown


def test_a_failed_job_shows_its_root_cause_once_in_few_lines(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "behaviour=raise")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert console.count('raise ValueError(f"rank {rank} asked to fail")') == 1  # the traceback, once
    assert console.count("rank 1 (node 0) failed: ValueError: rank 1 asked to fail") == 1
    assert "ddpw_runtime" not in console  # no frame of the launcher's own modules
    assert "Connection closed" not in console and "most recent call first" not in console
    assert len(console.splitlines()) <= 30, console
    assert "logs: logs/train/runs/" in proc.stdout  # where the logs are


@pytest.mark.parametrize("restarts", ["0", "1"])
def test_rank_0s_own_error_is_shown_as_hydra_shows_a_tasks_also_after_a_restart(tmp_path: Path, restarts: str) -> None:
    proc = run_app(tmp_path, "behaviour=raise", "fail_rank=0", f"hydra.launcher.max_restarts={restarts}")
    assert proc.returncode == 1
    traceback = proc.stderr[proc.stderr.index("Traceback (most recent call last):"):]
    assert traceback.splitlines()[1].startswith(f'  File "{APPS / "app.py"}"'), traceback  # from the task on
    assert "hydra/_internal" not in traceback and "ddpw_runtime" not in traceback, traceback
    assert "ValueError: rank asked to fail" in traceback and "HYDRA_FULL_ERROR=1" in traceback


def test_a_killed_rank_is_named_with_its_signal(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "behaviour=kill")
    assert proc.returncode == 1
    assert "rank 1 (node 0) failed: RankKilled: killed by SIGKILL" in proc.stderr


@pytest.mark.parametrize("restarts", [(), ("hydra.launcher.max_restarts=1",)], ids=["no restart", "restarts left"])
def test_rank_0_whose_task_calls_sys_exit_in_the_job_is_named_with_its_own_exit_code(
        tmp_path: Path, restarts: tuple[str, ...]) -> None:
    """The program ends inside the job (rank 1 fails in its barrier, and the supervisor takes the stacks): as Python
    lets go of its handlers, the supervisor's requests must not end it with their signal instead of its own code; and
    the program exits with that code, as without hydra-ddpw (it exited 1). With restarts left, the program's run has
    ended all the same: no attempt follows (it said it started the job again, then failed with 'Broken pipe')."""
    proc = run_app(tmp_path, "behaviour=sysexit", "fail_rank=0", *restarts)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "rank 0 failed: RankExited: exited with code 4" in proc.stdout, proc.stdout + proc.stderr
    assert "signal" not in proc.stdout, proc.stdout
    assert "starting the job again" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", [(), ("-m",)], ids=["plain", "multirun"])
def test_a_task_that_ends_with_sys_exit_0_on_every_rank_completes(tmp_path: Path, mode: tuple[str, ...]) -> None:
    """`sys.exit(0)` in the task is a task that is done, as without hydra-ddpw: in a plain run rank 0 is the program's
    own process, which ends there, past Hydra's job (its status 0 is its task's return)."""
    proc = run_app(tmp_path, *mode, "behaviour=sysexit_0_everywhere")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "job #0 COMPLETED" in proc.stdout and "RankLost" not in proc.stdout + proc.stderr


def test_what_rank_0_says_as_the_program_ends_reaches_its_log_as_every_other_ranks_does(tmp_path: Path) -> None:
    """Rank 0 of a plain run is the program's own process: what it said after its job (an exit handler's print, a
    finalizer's, a record logged at exit, a write to fd 2) reached the console but not `rank_0.log`, whereas every
    other rank's log has what its process says until it ends. It reaches both, fd 2's on stderr still."""
    proc = run_app(tmp_path, "behaviour=says_at_exit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = job_dirs(tmp_path)
    logs = {rank: (job / f"rank_{rank}.log").read_text() for rank in (0, 1)}
    said = ("an exit handler's print", "a record logged at exit", "a finalizer's print")
    for line in said:
        assert f"rank 0: {line}\n" in logs[0] and f"rank 0: {line}\n" in proc.stdout, (logs[0], proc.stdout)
    assert "rank 0: written to fd 2 at exit\n" in logs[0] and "rank 0: written to fd 2 at exit\n" in proc.stderr
    for line in (*said, "written to fd 2 at exit"):  # (a rank's finalizers did not run as it ended)
        assert f"rank 1: {line}\n" in logs[1], logs[1]


def test_a_plain_run_of_a_program_that_started_a_thread_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    """The refusal says what to do: it came with a traceback through hydra-ddpw's own frames, as a crash would."""
    proc = run_app(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", app="thread_before_run.py")
    assert proc.returncode == 1
    assert proc.stderr.startswith("a plain run with a ddpw launcher goes on in a fork of this process (the program's "
                                  "own process supervises the job), and the thread(s) prefetcher started before the "
                                  "run would not be there; start them inside the task, or run with -m\n"), proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.rglob("rank_*.log"))
    proc = run_app(tmp_path, "-m", "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", app="thread_before_run.py")
    assert proc.returncode == 0 and "[ddpw] job #0 COMPLETED" in proc.stdout, proc.stderr


def test_presets_of_hydra_ddpw_do_not_leak_into_other_apps(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "platform=gpu", app="own_platform_app.py")
    assert proc.returncode == 1 and "Could not find 'platform/gpu'" in proc.stderr
    assert "Available options in 'platform':\n\tlaptop\n" in proc.stderr
    proc = run_app(tmp_path, "--help", app="own_platform_app.py")
    assert proc.returncode == 0
    groups = proc.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    assert "platform: laptop" in groups and "gpu" not in groups and "ddpw" not in groups


def test_every_repo_rank_logs_once_to_the_job_log(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "hydra/job_logging=none")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    assert "info record from rank 1" in (job / "rank_1.log").read_text()  # Hydra's own logging, as rank 0 has
    for mode in ("a", "w"):  # (`mode: w`: the supervisor and rank 0 both append, neither writes over the other)
        (tmp_path / mode).mkdir()  # (a run dir of its own: the repo's run dirs are named to the second)
        proc = run_repo(tmp_path / mode, f"+hydra.job_logging.handlers.file.mode={mode}")
        assert proc.returncode == 0, proc.stderr
        (job,) = job_dirs(tmp_path / mode)
        job_log = (job / "repo_app.log").read_text()
        assert "info record from rank 0" in job_log and "info record from rank 1" not in job_log
        assert job_log.count("[ddpw][INFO] - 2 rank(s) (1 node(s) x 2) on cpu") == 1, job_log  # the supervisor's
        assert job_log.count("[ddpw]") == proc.stdout.count("[ddpw][INFO]") == 1, proc.stdout  # as a multirun logs


def test_a_custom_handler_that_writes_a_file_gets_rank_0s_records_only(tmp_path: Path) -> None:
    proc = run_repo(tmp_path, "--config-name", "repo_custom_log")
    assert proc.returncode == 0, proc.stderr
    (job,) = job_dirs(tmp_path)
    lines = (job / "lines.log").read_text()
    assert "info record from rank 0" in lines and "info record from rank 1" not in lines
    assert "info record from rank 1" in (job / "rank_1.log").read_text()  # its console handler still logs


# ----------------------------------------------------------------------- what a failure shows (tests/apps/app.py)
@pytest.mark.parametrize("console", ["pipe", "terminal"])
@pytest.mark.parametrize("failing", ["fail_rank=0", "fail_rank=1"])
def test_a_failing_console_ranks_last_c_output_is_shown_before_its_report(tmp_path: Path, console: str,
                                                                         failing: str) -> None:
    overrides = ("behaviour=printf_raise", failing, "platform.console_ranks=all")
    if console == "pipe":
        proc = run_app(tmp_path, *overrides)
        code, shown = proc.returncode, proc.stdout.replace("[rank 0] ", "").replace("[rank 1] ", "")
    else:
        code, shown = _in_terminal(tmp_path, *overrides, app="app.py")
        shown = shown.replace("\r\n", "\n").replace("[rank 0] ", "").replace("[rank 1] ", "")
    assert code == 1, shown
    # printf's text (no newline, in C's buffer when the task raised) on a line of its own, before the summary
    assert "\nlast words from C\n" in shown and shown.index("last words from C") < shown.index("rank_<k>.log")


def test_rank_0_stopped_in_a_dataloader_shows_only_the_failing_ranks_traceback(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=load_then_fail", "fail_rank=1")  # rank 0 iterates with 2 workers
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert console.count('raise ValueError("rank asked to fail while its peers load data")') == 1
    assert "rank 1 (node 0) failed: ValueError: rank asked to fail while its peers load data" in proc.stderr
    for not_shown in ("RankStopped", "DataLoader", "Warning", "Exception ignored", "did not end", "rank 0 was stopped"):
        assert not_shown not in console, console
    (job,) = job_dirs(tmp_path)
    log = (job / "rank_0.log").read_text()
    assert "--- rank 0 was stopped:" in log and "RankStopped" in log  # where it was, in its own log


STOPPED_MID_LINE = """
import time
import hydra
import torch.distributed as dist
import ddpw_runtime

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    if ddpw_runtime.rank() == 0:
        print("rank 0 was half way through a line", end="", flush=True)
    dist.barrier()
    if ddpw_runtime.rank() == 1:
        raise ValueError("rank 1 fails")
    while True:  # until the job's stop, after rank 1's failure
        time.sleep(0.1)

main()
"""


def test_rank_0_stopped_mid_line_ends_its_log_with_a_line_saying_how(tmp_path: Path) -> None:
    """Rank 0 of a plain run, stopped by rank 1's failure after a `print(.., end="")`: its log read
    `rank 0 was half way through a line--- rank 0 was stopped:` and the traceback, the note on the line its task left
    unfinished and with no cause on it; every other rank's log ends `--- rank 1 was stopped: Type: message`."""
    app = tmp_path / "stopped_mid_line.py"
    app.write_text(STOPPED_MID_LINE)
    proc = run_app(tmp_path, *LAUNCH, app=str(app))
    assert proc.returncode == 1
    assert "rank 1 (node 0) failed: ValueError: rank 1 fails" in proc.stderr, proc.stderr
    (job,) = job_dirs(tmp_path)
    log = (job / "rank_0.log").read_text()
    assert log.startswith("rank 0 was half way through a line\n"
                          "--- rank 0 was stopped: ddpw_runtime.errors.RankStopped: the job was stopped"), log


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_an_exception_whose_message_cannot_be_read_is_still_the_ranks_error(tmp_path: Path, fail_rank: int) -> None:
    proc = run_app(tmp_path, "behaviour=unprintable", f"fail_rank={fail_rank}")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert (f"rank {fail_rank} failed: __main__.Unprintable: <its message could not be read: str() raised "
            "RuntimeError: __str__ refuses>") in console
    assert console.count('raise Unprintable("never shown")') == 1  # its traceback, with the source line
    assert "RankExited" not in console and "records.py" not in console


# ----------------------------------------------------------------------- the run's start never goes on alone
def test_a_dry_run_prints_the_plan_and_never_runs_the_task_with_values_only_a_rank_resolves(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "hydra.launcher.dry_run=true", "+x=${oc.env:NOT_SET}",
                   '+local_rank="${oc.decode:${oc.env:LOCAL_RANK}}"')
    assert proc.returncode == 0, proc.stderr
    assert '--- job #0: +x=${oc.env:NOT_SET} +local_rank="${oc.decode:${oc.env:LOCAL_RANK}}" (dry run' in proc.stdout
    assert "world size      : 2 (1 node(s) x 2 rank(s))" in proc.stdout
    assert "hello from rank" not in proc.stdout and "Warning" not in proc.stderr
    assert not list(tmp_path.rglob("seen_rank_*.json")) and not list(tmp_path.rglob("rank_*.log"))


def test_a_failure_in_the_runs_start_ends_the_program_and_the_task_never_runs_alone(tmp_path: Path) -> None:
    # A resolver that holds a lock: the program's Hydra state cannot travel to the ranks.
    proc = run_app(tmp_path, "+hydra.callbacks.locked._target_=recorder.LockedResolver")
    assert proc.returncode == 1
    assert "cannot pickle '_thread.lock' object" in proc.stderr
    assert "hello from rank" not in proc.stdout and "Warning" not in proc.stderr
    assert not list(tmp_path.rglob("seen_rank_*.json"))
