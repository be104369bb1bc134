"""Supervision the task cannot reach: whatever rank 0's task does to its own process (a plain run's rank 0
is the user's process), the job ends as docs/faults.md says, and every wait for a process is bounded.
Real processes throughout; each test checks nothing is left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import APPS, alive, job_dirs, leftover, run_app, seen, wait_for

pytestmark = pytest.mark.subprocess

SHORT_GRACE = "hydra.launcher.interrupt_grace_s=1"
FREEZER = Path("/sys/fs/cgroup/freezer")


def _start(cwd: Path, *overrides: str, cgroup_v2: bool = True, app: Path = APPS / "app.py") -> subprocess.Popen:
    """The test app in a session of its own (so a signal to its group reaches it alone), output as text; without
    `cgroup_v2`, on a machine without one (a mount namespace of its own, where no cgroup v2 is mounted)."""
    command = [sys.executable, str(app), *overrides]
    if not cgroup_v2:
        unmount = "".join(f"umount {point} && " for point in _cgroup_v2_mounts())
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{unmount}exec "$@"', "sh", *command]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _cgroup_v2_mounts() -> list[str]:
    """Where cgroup v2 is mounted here."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [fields[4] for fields in map(str.split, lines) if fields[fields.index("-") + 1] == "cgroup2"]


def _can_leave_cgroup_v2() -> bool:
    """Whether a process can be started here in a mount namespace of its own (root, `unshare`)."""
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def _started(tmp_path: Path, proc: subprocess.Popen, ranks: int = 2) -> dict:
    """Wait until every rank of the (single) job is inside the task; what they reported."""
    wait_for(lambda: job_dirs(tmp_path) and len(seen(job_dirs(tmp_path)[0])) == ranks or proc.poll() is not None,
             what="the ranks to start")
    assert proc.poll() is None, proc.communicate()
    return seen(job_dirs(tmp_path)[0])


@pytest.mark.parametrize(
    "flags, behaviour, sig, code",
    [((), "ignore_sigint", signal.SIGINT, 130), ((), "ignore_sigterm", signal.SIGTERM, 143),
     ((), "gil", signal.SIGINT, 130), (("-m",), "ignore_sigterm", signal.SIGTERM, 143)],
)
def test_a_task_that_ignores_the_signal_or_holds_the_gil_is_ended_after_the_grace(
    tmp_path: Path, flags: tuple, behaviour: str, sig: int, code: int
) -> None:
    proc = _start(tmp_path, *flags, f"behaviour={behaviour}", SHORT_GRACE)
    ranks = _started(tmp_path, proc)
    proc.send_signal(sig)  # to the program's own pid, as `kill` or a scheduler sends it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    if not flags:  # a plain run says how to end it at once: the same signal again
        name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
        assert f"{name}: every rank gets it and 1 s to end; {name} again ends them at once" in err, err
    for rank, report in ranks.items():  # the only way to end them, and the console names each, once
        task = ", the program's task" if rank == 0 and not flags else ""
        assert err.count(f"rank {rank} (pid {report['pid']}{task}) did not end in the time it was given; killed") \
            == 1, err
    assert leftover(ranks) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_reaches_rank_0_once_and_a_second_one_kills_at_once(tmp_path: Path, sig: int) -> None:
    """Ctrl-C typed in the terminal (it reaches the whole group), or SIGTERM sent to the program (as `kill` does)."""
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    behaviour = f"behaviour=ignore_{signal.Signals(sig).name.lower()}"
    proc = _start(tmp_path, behaviour, "hydra.launcher.interrupt_grace_s=600")
    ranks = _started(tmp_path, proc)
    send = os.killpg if sig == signal.SIGINT else os.kill
    send(proc.pid, sig)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while line and f"{name} again ends them at once" not in line:
        line = proc.stderr.readline()
    send(proc.pid, sig)  # and a second one: no waiting for the 600 s grace
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    # A rank named as killed is killed as the signal came again, not for taking longer than it was given (600 s).
    assert "did not end in the time it was given" not in err, err
    assert leftover(ranks) == []


def test_a_non_daemon_thread_left_by_the_task_keeps_the_program_and_is_named(tmp_path: Path) -> None:
    proc = _start(tmp_path, "behaviour=linger")
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while line and "keeps running" not in line:
        line = proc.stderr.readline()
    assert "lingering-writer" in line, line  # the console names the thread
    ranks = seen(job_dirs(tmp_path)[0])
    wait_for(lambda: not alive(ranks[1]["pid"]), timeout=10, what="rank 1 to end")  # the job has ended
    assert proc.poll() is None  # as Python keeps such a program running
    (tmp_path / "release").write_text("")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert leftover(ranks) == []


def test_what_rank_0s_task_forks_has_no_handler_of_hydra_ddpw(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=fork_report")
    assert proc.returncode == 0, proc.stderr
    found = json.loads((job_dirs(tmp_path)[0] / "fork_handlers.json").read_text())
    assert found["handlers"] == {
        "SIGINT": repr(signal.default_int_handler), "SIGTERM": repr(signal.SIG_DFL),
        "SIGUSR2": repr(signal.SIG_DFL), "SIGRTMIN+3": repr(signal.SIG_DFL),
    }
    assert found["raised"] == "builtins.KeyboardInterrupt"  # Python's own, not hydra-ddpw's


@pytest.mark.skipif(not os.access(FREEZER, os.W_OK), reason="needs the cgroup v1 freezer (root on cgroup v1)")
@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain", "multirun"])
def test_a_rank_that_does_not_die_after_sigkill_is_named_and_the_job_still_ends(tmp_path: Path, flags: tuple) -> None:
    freezer = FREEZER / f"ddpw-test-{os.getpid()}-{len(flags)}"
    try:
        proc = run_app(tmp_path, *flags, "behaviour=freeze", f"freezer={freezer}", "platform.timeout_min=0.02",
                       timeout=180)
        assert proc.returncode == 1, proc.stderr
        console = proc.stdout + proc.stderr
        assert "rank 1 (pid" in console and "did not exit" in console and "left behind" in console
        assert console.count("left behind") == 1, console  # named once, not waited for again as the job's process
        assert "ran past its time limit" in console
    finally:
        if freezer.exists():
            (freezer / "freezer.state").write_text("THAWED")
            frozen = [int(pid) for pid in (freezer / "tasks").read_text().split()]
            for pid in frozen:
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not (freezer / "tasks").read_text().split(), timeout=10, what="the frozen rank to go")
            freezer.rmdir()


@pytest.mark.skipif(not os.access(FREEZER, os.W_OK), reason="needs the cgroup v1 freezer (root on cgroup v1)")
def test_closing_a_rank_starter_that_does_not_die_is_bounded() -> None:
    from ddpw_runtime.launch.starter import RankStarter

    starter = RankStarter(preload=False)
    freezer = FREEZER / f"ddpw-test-starter-{os.getpid()}"
    freezer.mkdir()
    try:
        (freezer / "tasks").write_text(str(starter.pid))
        (freezer / "freezer.state").write_text("FROZEN")
        starter.close()  # returns: the starter is named as left behind, not waited for
        assert not starter.alive() or (freezer / "tasks").read_text().split() == [str(starter.pid)]
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        wait_for(lambda: not (freezer / "tasks").read_text().split(), timeout=10, what="the starter to go")
        freezer.rmdir()


@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain run", "multirun"])
def test_a_tasks_own_sigusr1_handler_is_never_run_and_the_time_limit_still_shows_its_stack(
        tmp_path: Path, flags: tuple) -> None:
    """Stack dumps are asked for with a signal no task uses: a task that checkpoints on SIGUSR1 (as SLURM users
    write) is not made to checkpoint by hydra-ddpw's time limit, and the report still shows where it was."""
    proc = run_app(tmp_path, *flags, "behaviour=own_sigusr1_hang", "platform.timeout_min=0.03")
    assert proc.returncode != 0
    assert "ran past its time limit (platform.timeout_min=0.03)" in proc.stderr
    assert f"rank 1: NOT IN THE COLLECTIVE, at misbehave ({APPS / 'app.py'}:" in proc.stderr
    (job,) = job_dirs(tmp_path)
    assert sorted(seen(job)) == [0, 1]
    assert not list(job.glob("sigusr1_rank_*"))  # the task's handler never ran
    assert leftover(seen(job)) == []


BLOCKING_CALLBACK = "+hydra.callbacks.block._target_=blocking_callback.BlocksAtJobEnd"


@pytest.mark.parametrize("second", [False, True], ids=["bounded", "second SIGTERM"])
def test_a_multirun_held_by_a_callback_with_signals_blocked_ends_after_sigterm(tmp_path: Path, second: bool) -> None:
    """A user callback blocks in `on_job_end` with SIGTERM blocked: the sweep still ends, its job process killed
    once the interrupt grace and the kill bound have passed, or at once on a second SIGTERM."""
    grace = "1" if not second else "600"  # a second SIGTERM does not wait for it
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err_file:
        proc = subprocess.Popen([sys.executable, str(APPS / "app.py"), "-m", BLOCKING_CALLBACK,
                                 f"hydra.launcher.interrupt_grace_s={grace}"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=err_file, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: bool(list(tmp_path.rglob("blocking"))) or proc.poll() is not None, timeout=120,
             what="the callback to block")
    assert proc.poll() is None, proc.communicate()
    (marker,) = tmp_path.rglob("blocking")
    job_process = int(marker.read_text())
    os.kill(proc.pid, signal.SIGTERM)
    stopping = "Terminated (SIGTERM): stopping job #0; SIGTERM again kills it at once."
    if second:
        wait_for(lambda: stopping in errors.read_text(), what="the sweep to pass SIGTERM on")
        os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    err = errors.read_text()
    assert proc.returncode == 143, err
    assert stopping in err
    assert ("Terminated (SIGTERM): job #0 was killed at once, as SIGTERM came again." if second else
            "Terminated (SIGTERM): every rank of job #0 was stopped.") in err
    assert not alive(job_process)
    summary = json.loads((marker.parent.parent / "sweep_summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["TERMINATED"]


@pytest.mark.parametrize("cgroup_v2", [True, False], ids=["cgroup v2 where there is one", "no cgroup v2"])
def test_rank_0_killed_while_its_forks_live_ends_the_job_naming_it_and_its_forks_go_too(
    tmp_path: Path, cgroup_v2: bool
) -> None:
    """Rank 0 of a plain run (the user's process) dies of SIGKILL, as the OOM killer does, while processes it
    forked without exec are alive: the supervisor learns it from rank 0's own end, not when those forks end; the forks
    end with the job also where it has no cgroup (they are the supervisor's children once rank 0 is gone)."""
    if not cgroup_v2 and not _can_leave_cgroup_v2():
        pytest.skip("needs a mount namespace of the test's own (root)")
    proc = _start(tmp_path, "behaviour=fork_wait", cgroup_v2=cgroup_v2)
    wait_for(lambda: bool(job_dirs(tmp_path)) and len(list(job_dirs(tmp_path)[0].glob("forked_rank_*.json"))) == 2
             or proc.poll() is not None, what="every rank to fork")
    assert proc.poll() is None, proc.communicate()
    job = job_dirs(tmp_path)[0]
    ranks = seen(job)
    forks = [json.loads((job / f"forked_rank_{rank}.json").read_text()) for rank in (0, 1)]
    os.kill(ranks[0]["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "rank 0 failed: RankKilled: killed by SIGKILL" in out + err
    assert "did not exit" not in out + err  # no false "left behind"
    wait_for(lambda: not any(alive(pid) for pid in forks) and leftover(ranks) == [], timeout=10,
             what="the forks and the ranks to end with the job")


_FORKS_A_PROCESS = """
import multiprocessing, os, time
import hydra, torch.distributed as dist
import ddpw_runtime

def sleep() -> None:
    time.sleep(600)

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg) -> None:
    if cfg.get("daemon"):  # a daemon's double fork, in a session of its own, no exec
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(f"daemon_{ddpw_runtime.rank()}.txt", "w") as file:
                    file.write(str(os.getpid()))
                time.sleep(600)
            os._exit(0)
        return
    if ddpw_runtime.rank() == 0:  # a worker of its own, as Python's exit joins it (not a daemon)
        process = multiprocessing.get_context("fork").Process(target=sleep)
        process.start()
        with open("forked.txt", "w") as file:
            file.write(str(process.pid))
    dist.barrier()
    if cfg.get("fail") and ddpw_runtime.rank() == 1:
        raise ValueError("rank 1 fails")

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("cgroup_v2", [True, False], ids=["cgroup v2 where there is one", "no cgroup v2"])
@pytest.mark.parametrize("fail", [False, True], ids=["completed", "rank 1 failed"])
def test_a_multiprocessing_process_rank_0_started_ends_with_the_job_and_the_program_with_it(
    tmp_path: Path, cgroup_v2: bool, fail: bool
) -> None:
    """Rank 0 of a plain run starts a `multiprocessing.Process` (forked, no exec, not a daemon) that outlives its
    task: it ends with the job, as every other rank's does, and so the program ends, also where the job has no cgroup
    (rank 0's process, whose exit joins it, waited for it: for ever, here for its 600 s)."""
    if not cgroup_v2 and not _can_leave_cgroup_v2():
        pytest.skip("needs a mount namespace of the test's own (root)")
    app = tmp_path / "forks_a_process.py"
    app.write_text(_FORKS_A_PROCESS)
    proc = _start(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", f"+fail={fail}",
                  "hydra.run.dir=out", cgroup_v2=cgroup_v2, app=app)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        forked = tmp_path / "forked.txt"
        process = int(forked.read_text()) if forked.exists() else None
        if proc.poll() is None:  # (what the test must not leave behind when it fails)
            proc.kill()
            if process is not None:
                os.kill(process, signal.SIGKILL)
    assert proc.returncode == (1 if fail else 0), err
    assert process is not None and not alive(process)


@pytest.mark.parametrize("cgroup_v2", [True, False], ids=["cgroup v2 where there is one", "no cgroup v2"])
def test_a_daemon_rank_0_started_in_a_session_of_its_own_ends_with_the_run(tmp_path: Path, cgroup_v2: bool) -> None:
    """Every rank of a plain run starts a daemon (a double fork into a session of its own, no exec): each ends with
    the run, also without a cgroup; rank 0's, the supervisor's child once its parent is gone, was spared as not in
    the program's process group, and outlived the run."""
    if not cgroup_v2 and not _can_leave_cgroup_v2():
        pytest.skip("needs a mount namespace of the test's own (root)")
    app = tmp_path / "forks_a_process.py"
    app.write_text(_FORKS_A_PROCESS)
    proc = _start(tmp_path, "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2", "+daemon=true",
                  "hydra.run.dir=out", cgroup_v2=cgroup_v2, app=app)
    try:  # (one left holds the program's output open: no end of it is seen)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        daemons = [int(path.read_text()) for path in tmp_path.glob("daemon_*.txt")]
        assert len(daemons) == 2
        wait_for(lambda: not any(alive(pid) for pid in daemons), timeout=15, what="the daemons to end with the run")
    finally:
        for path in tmp_path.glob("daemon_*.txt"):  # (what the test must not leave behind when it fails)
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(path.read_text()), signal.SIGKILL)


def test_what_rank_0_leaves_running_in_the_background_is_reaped_while_the_run_goes_on(tmp_path: Path) -> None:
    """Rank 0's task starts short commands in the background (`sleep 0.1 &`, through a shell that ends at once): each
    is the supervisor's once its shell is gone, and is reaped when it ends, while the run goes on (no zombies piling
    up in a long run)."""
    proc = _start(tmp_path, "behaviour=background_wait")
    wait_for(lambda: bool(job_dirs(tmp_path)) and (job_dirs(tmp_path)[0] / "background_rank_0.json").exists()
             or proc.poll() is not None, what="rank 0 to start its commands")
    assert proc.poll() is None, proc.communicate()
    job = job_dirs(tmp_path)[0]
    ranks = seen(job)
    commands = json.loads((job / "background_rank_0.json").read_text())
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in commands), timeout=15,
             what="the commands to end and be reaped (not left as zombies)")
    assert proc.poll() is None  # (the run goes on)
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="the ranks to end")


@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain run", "multirun"])
def test_the_rank_starter_killed_leaves_no_process_of_the_job(tmp_path: Path, flags: tuple) -> None:
    """The rank starter dies of SIGKILL (the OOM killer may pick it): its ranks die with it, and what they started,
    in their own sessions too, is stopped by the process that supervised them."""
    proc = _start(tmp_path, *flags, "behaviour=children_wait")
    wait_for(lambda: bool(job_dirs(tmp_path)) and len(list(job_dirs(tmp_path)[0].glob("children_rank_*.json"))) == 2
             or proc.poll() is not None, what="every rank to start its children")
    assert proc.poll() is None, proc.communicate()
    job = job_dirs(tmp_path)[0]
    ranks = seen(job)
    children = [pid for rank in (0, 1) for pid in json.loads((job / f"children_rank_{rank}.json").read_text())]
    os.kill(ranks[1]["ppid"], signal.SIGKILL)  # rank 1's parent: the starter
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "the rank starter (pid" in err and "died" in err and "Traceback" not in err, err  # said in one line
    if flags:  # the sweep's summary has the job as FAILED, not as still running
        (record,) = json.loads((job.parent / "sweep_summary.json").read_text())["jobs"]
        assert record["status"] == "FAILED" and "the rank starter" in record["error"], record
    wait_for(lambda: not any(alive(pid) for pid in children) and leftover(ranks) == [], timeout=15,
             what="every process of the job to end")


def test_a_job_process_killed_fails_its_job_naming_the_signal_in_one_line(tmp_path: Path) -> None:
    """A multirun's job process dies of SIGKILL (the OOM killer may pick it) while its ranks run: the sweep fails
    naming the job, its process and the signal in one line (it showed a traceback of hydra-ddpw's code ending in
    `ended without a result (exit code -9)`), the summary has the job FAILED so, and no rank is left."""
    proc = _start(tmp_path, "-m", "behaviour=wait")
    ranks = _started(tmp_path, proc)
    starter = ranks[0]["ppid"]
    (job_process,) = set(_children(starter)) - {report["pid"] for report in ranks.values()}
    os.kill(job_process, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    said = f"the process of job #0 (pid {job_process}) was killed by SIGKILL before it said how its job ended"
    assert said in err and "Traceback" not in err, err
    (record,) = json.loads((job_dirs(tmp_path)[0].parent / "sweep_summary.json").read_text())["jobs"]
    assert record["status"] == "FAILED" and said in record["error"], record
    wait_for(lambda: leftover(ranks) == [], timeout=15, what="the ranks to end")


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [child for child in _descendants(pid) if _parent(child) == pid]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, whatever its session (the ranks and the starter lead sessions of their own)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue  # ended meanwhile
    found, todo = [], [pid]
    while todo:
        above = todo.pop()
        below = [child for child, parent in parents.items() if parent == above]
        found += below
        todo += below
    return found


@pytest.mark.parametrize("flags", [(), ("-m",)], ids=["plain run", "multirun"])
def test_sigterm_to_every_process_of_the_job_lets_each_rank_save_and_ends_as_terminated(
    tmp_path: Path, flags: tuple
) -> None:
    """SIGTERM reaches every process of the job at once (`pkill -f train.py`, a service manager's stop): each rank's
    own handler saves, the program exits 143 as terminated; the rank starter, which got it too, is not what ends the
    job (it ended every rank at once, and the job failed with `StarterGone`)."""
    proc = _start(tmp_path, *flags, "behaviour=wait")
    ranks = _started(tmp_path, proc)
    for pid in [proc.pid, *_descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "the rank starter" not in err and "Traceback" not in err, err
    job = job_dirs(tmp_path)[0]
    assert sorted(path.name for path in job.glob("saved_rank_*.txt")) == ["saved_rank_0.txt", "saved_rank_1.txt"]
    if flags:
        (record,) = json.loads((job.parent / "sweep_summary.json").read_text())["jobs"]
        assert record["status"] == "TERMINATED", record
    wait_for(lambda: leftover(ranks) == [], timeout=10, what="the ranks to end")


_IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
                   "time.sleep(60)"
_ENDS_ON_SIGTERM = "import time; print('ready', flush=True); time.sleep(60)"


def test_children_stop_gives_the_first_signal_a_grace_then_kills_and_reports_each_end() -> None:
    """The one interface every supervising process watches and stops its children with: adopted children are
    watched by their pidfd; `stop` sends the first signal, waits the grace, then SIGKILLs what ignored it."""
    from ddpw_runtime.launch.children import Children, ChildState

    ended: list[int] = []
    children = Children(on_exit=lambda child: ended.append(child.pid))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
             for code in (_ENDS_ON_SIGTERM, _IGNORES_SIGTERM)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        children.adopt(proc.pid, f"child {proc.pid}")
    assert children.next_exit(0.0) is None  # both run
    left = children.stop(signal.SIGTERM, grace_s=0.5)
    assert left == []
    assert sorted(ended) == sorted(proc.pid for proc in procs)
    polite, stubborn = (children.of_pid[proc.pid] for proc in procs)
    assert (polite.exit_code, stubborn.exit_code) == (-signal.SIGTERM, -signal.SIGKILL)
    assert all(child.state is ChildState.ENDED and child.stopped and not child.alive for child in (polite, stubborn))
    assert not any(alive(proc.pid) for proc in procs)
    for proc in procs:  # (reaped by the watcher: Popen learns it here)
        proc.wait()
