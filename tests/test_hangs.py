"""A hung job names the rank that holds it up, and where that rank is: when a collective times out, at the time
limit, on request while the job runs, and when it stalls. Real processes and gloo throughout; the report is read
from the console and from `RankFailure`."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ddpw_conf import Layout, Platform
from ddpw_runtime import RankFailure, Wrapper, rank
from ddpw_runtime.launch.plan import DUMP_SIGNAL
from ddpw_runtime.launch.recorded import Collective, Recorded, recorded_in
from ddpw_runtime.launch.stacks import Frame, HangReport, RankPlace, WorkerPlace, from_dump, from_traceback
from tests.helpers import APPS, job_dirs, leftover, run_app, run_ranks, seen, start_app, wait_for

APP = APPS / "app.py"
SHORT = "platform.collective_timeout_min=0.03"
"""A collective times out after 1.8 s."""


def _line_of(text: str, offset: int = 0) -> int:
    """The line number of the app's line `text` (plus `offset`)."""
    return APP.read_text().splitlines().index(text) + 1 + offset


LOAD_BATCH = _line_of('def load_batch() -> None:', 3)  # its `time.sleep(1)`


@pytest.mark.subprocess
def test_the_rank_outside_the_collective_is_named_with_where_it_was_among_3(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hold_up", "fail_rank=2", "platform.n_procs_per_node=3", SHORT)
    assert proc.returncode == 1, proc.stderr
    # the collective and its sequence number, from the ranks' flight recorders (the app's 2 all_reduce, then this)
    assert "rank 2 failed: NotInCollective: ranks 0-1 waited for it in all_reduce #3 until the collective timed " \
           f"out; it was at load_batch ({APP}:{LOAD_BATCH}) <- hold_up (" in proc.stdout  # the job's summary
    assert "  rank 2: NOT IN THE COLLECTIVE (SIGTERM, exit -15)" in proc.stdout
    assert "  rank 0: waited in the collective" in proc.stdout and "  rank 1: waited in the collective" in proc.stdout
    report = proc.stderr[proc.stderr.index("where each rank was"):]
    lines = report.splitlines()
    job = job_dirs(tmp_path)[0]
    assert lines[0].endswith(f"; each rank's last collectives: {job.resolve()}/fr_rank_<k>:")
    assert lines[1].startswith(f"  rank 2: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH}) <- hold_up (")
    assert lines[1].endswith("; collectives: last entered all_reduce #2, not all_reduce #3")
    assert lines[2].startswith("  rank 0: waiting in all_reduce, at hold_up (")
    assert lines[3].startswith("  rank 1: waiting in all_reduce, at hold_up (")
    assert lines[2].endswith("; collectives: last entered all_reduce #3")
    assert lines[3].endswith("; collectives: last entered all_reduce #3")
    assert "what a waiting rank raised (secondary): rank " in report and "Timed out waiting" in report
    assert "in load_batch" in (job / "stacks_rank_2.txt").read_text()  # every thread's stack, next to its log
    assert all((job / f"fr_rank_{k}").stat().st_size > 0 for k in range(3))  # each rank's flight recorder
    assert leftover(seen(job)) == []


@pytest.mark.subprocess
def test_a_waiting_rank_that_nccls_watchdog_aborts_still_leads_to_the_rank_outside_the_collective(
        tmp_path: Path) -> None:
    """NCCL's watchdog logs a collective's timeout and aborts the rank (SIGABRT, no result; seen on a GPU, stood in
    for by the app here): the rank it waited for is named from the waiting rank's log and crash report."""
    proc = run_app(tmp_path, "behaviour=aborted_as_by_nccl", "fail_rank=1")
    assert proc.returncode == 1, proc.stderr
    # (no sequence number: NCCL dumps the aborted rank's flight recorder as it times out; gloo has no such dump)
    assert "rank 1 (node 0) failed: NotInCollective: rank 0 waited for it in all_reduce until the collective timed " \
           f"out; it was at load_batch ({APP}:{LOAD_BATCH}) <- " in proc.stderr, proc.stderr
    report = proc.stderr[proc.stderr.index("where each rank was"):].splitlines()
    assert report[1].startswith(f"  rank 1: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH}) <- hold_up (")
    assert report[2].startswith("  rank 0: waiting in all_reduce, at hold_up (")  # its main thread, when it died
    assert "what a waiting rank raised (secondary): rank 0: [rank0]:[E1127" in proc.stderr  # its watchdog's line
    assert "Watchdog caught collective operation timeout" in proc.stderr
    assert leftover(seen(job_dirs(tmp_path)[0])) == []


@pytest.mark.subprocess
def test_a_rank_still_starting_when_the_stacks_are_taken_is_not_ended_by_the_request(tmp_path: Path) -> None:
    """Rank 1 is a fresh interpreter (spawn) still importing torch when rank 0's wait for it times out: the job's
    stop asks every rank for its stacks before any is stopped, and rank 1, which has no handler yet, ignores it."""
    proc = run_app(tmp_path, "platform.spawn_method=spawn", "platform.collective_timeout_min=0.01")
    assert proc.returncode == 1, proc.stderr
    assert "rank 0 failed: torch.distributed.DistStoreError" in proc.stdout, proc.stdout
    assert "  rank 1: stopped (SIGTERM, exit -15)" in proc.stdout, proc.stdout
    assert f"signal {int(DUMP_SIGNAL)}" not in proc.stdout + proc.stderr


@pytest.mark.subprocess
def test_a_waiting_rank_stopped_as_it_ends_is_still_known_to_have_waited(tmp_path: Path) -> None:
    """Ranks 0 and 1 time out; letting go of rank 1's frames takes a second (as a DataLoader's workers are joined),
    and the job's stop (SIGTERM) comes meanwhile: rank 1 still writes that it waited, so rank 2 alone is named."""
    proc = run_app(tmp_path, "-m", "behaviour=hold_up_slow_end", "fail_rank=2", "platform.n_procs_per_node=3", SHORT,
                   "hydra.launcher.stop_grace_s=20")
    assert proc.returncode == 1, proc.stderr
    assert "rank 2 (node 0) failed: NotInCollective: ranks 0-1 waited for it in all_reduce" in proc.stderr
    assert "  rank 1: waiting in all_reduce, at hold_up (" in proc.stderr


def _held_up_by_rank(holder: int = 1) -> None:
    import torch
    import torch.distributed as dist

    if rank() == holder:
        while True:
            time.sleep(1)
    dist.all_reduce(torch.ones(1))


def _mismatched_collectives() -> None:
    import torch
    import torch.distributed as dist

    if rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        dist.broadcast(torch.ones(1), src=0)


@pytest.mark.subprocess
def test_ranks_in_different_collectives_are_named_with_each_ones_collective_and_line(tmp_path: Path) -> None:
    """Rank 0 all-reduces while rank 1 broadcasts (gloo waits until the collective timeout): the failure says the ranks
    entered different collectives, which, and where in the task (it was a bare gloo timeout, its rank by chance)."""
    with pytest.raises(RankFailure) as info:
        run_ranks(_mismatched_collectives, platform=Platform(n_procs_per_node=2, collective_timeout_min=0.03),
                  log_dir=tmp_path)
    failure = info.value
    assert failure.error_type == "CollectiveMismatch", failure
    where = f"at _mismatched_collectives ({__file__}:"
    assert f"rank 0 in all_reduce {where}" in failure.error_message, failure.error_message
    assert f"rank 1 in broadcast {where}" in failure.error_message
    assert "every rank must enter the same collectives, in the same order" in failure.error_message
    assert failure.hang is not None and failure.hang.waiting == [0, 1]


MISMATCHED_APP = """
import datetime
import hydra
import torch
import torch.distributed as dist
import ddpw_runtime

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    timing_out_first = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    if ddpw_runtime.rank() == 0:
        dist.all_reduce(torch.ones(1), group=timing_out_first)
    else:
        dist.barrier()

main()
"""


@pytest.mark.subprocess
def test_a_plain_runs_rank_0_named_for_a_mismatch_shows_the_report_not_its_bare_timeout(tmp_path: Path) -> None:
    """Rank 0 all-reduces while rank 1 enters a barrier, in a plain run; rank 0's collective (of a group with a shorter
    timeout) times out first, so the job's failure is the mismatch, named on rank 0. Hydra's error is that failure,
    with where each rank was, not rank 0's bare gloo timeout (which was all the console showed below the job's
    summary line)."""
    app = tmp_path / "mismatch.py"
    app.write_text(MISMATCHED_APP)
    proc = subprocess.run([sys.executable, str(app), "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2",
                           "platform.collective_timeout_min=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert "rank 0 (node 0) failed: CollectiveMismatch: the ranks waited in different collectives until rank 0's " \
           "timed out" in proc.stderr, proc.stderr
    report = proc.stderr[proc.stderr.index("where each rank was"):].splitlines()
    assert report[1].startswith(f"  rank 0: waiting in all_reduce, at main ({app}:12)"), report
    assert report[2].startswith(f"  rank 1: waiting in barrier, at main ({app}:14)"), report
    assert "--- traceback of rank 0 ---" in proc.stderr and "Timed out waiting" in proc.stderr


@pytest.mark.subprocess
def test_in_ddp_training_the_rank_outside_the_gradient_all_reduce_is_named_among_3(tmp_path: Path) -> None:
    """DDP all-reduces gradients inside `backward()`, from hooks that leave no frame of torch.distributed on the
    waiting ranks' stacks: they still count as waiting, and the rank stuck loading its batch is the cause."""
    proc = run_app(tmp_path, "behaviour=train_held_up", "fail_rank=2", "platform.n_procs_per_node=3", SHORT)
    assert proc.returncode == 1, proc.stderr
    assert "rank 2 failed: NotInCollective: ranks 0-1 waited for it in all_reduce #" in proc.stdout
    assert f"  rank 2: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH}) <- train_held_up (" in proc.stderr
    for waiting in (0, 1):
        assert f"  rank {waiting}: waiting in backward (DDP's gradient all-reduce), at train_held_up (" in proc.stderr


@pytest.mark.subprocess
def test_the_failure_names_the_rank_outside_the_collective_among_2(tmp_path: Path) -> None:
    with pytest.raises(RankFailure) as info:
        run_ranks(_held_up_by_rank, platform=Platform(n_procs_per_node=2, collective_timeout_min=0.03),
                  log_dir=tmp_path)
    failure = info.value
    assert (failure.rank, failure.error_type) == (1, "NotInCollective")
    assert failure.hang is not None
    assert (failure.hang.culprits, failure.hang.waiting) == ([1], [0])
    place = failure.hang.place(1)
    assert place is not None and place.where().startswith(f"_held_up_by_rank ({__file__}:")
    assert failure.hang.place(0).call == "all_reduce"  # type: ignore[union-attr]
    assert "Timed out waiting" in failure.waiting_error
    assert failure.__cause__ is not None and "Timed out waiting" in str(failure.__cause__)


def _held_up_in_the_ipc_group() -> None:
    import torch
    import torch.distributed as dist

    import ddpw_runtime

    if rank() == 1:
        while True:
            time.sleep(1)
    dist.all_reduce(torch.ones(1), group=ddpw_runtime.group())


@pytest.mark.subprocess
def test_a_collective_in_a_ranks_ipc_group_times_out_after_the_collective_timeout(tmp_path: Path) -> None:
    """`platform.ipc_groups` groups are hydra-ddpw's too: a collective in one waits `collective_timeout_min`, as in the
    world group, and the rank outside it is named (it waited torch's default 30 minutes; here the job's time limit,
    far later than the collective timeout, ended it first, as JobTimedOut)."""
    platform = Platform(n_procs_per_node=2, ipc_groups=[[0, 1]], collective_timeout_min=0.03, timeout_min=1)
    with pytest.raises(RankFailure) as info:
        run_ranks(_held_up_in_the_ipc_group, platform=platform, log_dir=tmp_path)
    failure = info.value
    assert (failure.rank, failure.error_type) == (1, "NotInCollective"), failure
    assert "Timed out waiting" in failure.waiting_error


def _held_up_in_the_tensor_group() -> None:
    import torch
    import torch.distributed as dist

    import ddpw_runtime

    if rank() == 1:
        while True:
            time.sleep(1)
    if rank() == 0:  # (ranks 2 and 3, the other tensor group, return)
        dist.all_reduce(torch.ones(1), group=ddpw_runtime.group("tensor"))


@pytest.mark.subprocess
def test_a_collective_in_a_layouts_group_times_out_after_the_collective_timeout(tmp_path: Path) -> None:
    """The groups of `platform.layout` (a DeviceMesh, whose `init_device_mesh` takes no timeout) are hydra-ddpw's too:
    a collective in one waits `collective_timeout_min`, and the rank outside it is named (it waited torch's default 30
    minutes; here the job's time limit ended it first, as JobTimedOut). 4 ranks: an axis as wide as the world is the
    world group itself."""
    platform = Platform(n_procs_per_node=4, layout=Layout(tensor=2), collective_timeout_min=0.03, timeout_min=1)
    with pytest.raises(RankFailure) as info:
        run_ranks(_held_up_in_the_tensor_group, platform=platform, log_dir=tmp_path)
    failure = info.value
    assert (failure.rank, failure.error_type) == (1, "NotInCollective"), failure
    assert "Timed out waiting" in failure.waiting_error


@pytest.mark.subprocess
def test_the_callers_rank_0_outside_the_collective_is_named(tmp_path: Path) -> None:
    """`Wrapper(caller_rank=True)` whose rank 0, the caller, never reaches the collective rank 1 waits in: rank 0 is
    named, where it was in the caller, and the timeout is the cause. The failure was rank 1's bare gloo timeout (where
    the caller's rank 0 was, taken as the job was stopped, did not reach the job's outcome), caused by the RankStopped
    that stopped rank 0."""
    runner = Wrapper(Platform(n_procs_per_node=2, collective_timeout_min=0.03), log_dir=tmp_path, caller_rank=True)
    with pytest.raises(RankFailure) as info:
        runner.start(_held_up_by_rank, 0)
    failure = info.value
    assert (failure.rank, failure.error_type) == (0, "NotInCollective"), str(failure)
    assert failure.hang is not None and (failure.hang.culprits, failure.hang.waiting) == ([0], [1])
    place = failure.hang.place(0)
    assert place is not None and place.where().startswith(f"_held_up_by_rank ({__file__}:")
    assert "Timed out waiting" in str(failure.__cause__)


@pytest.mark.subprocess
def test_rank_0_of_a_plain_run_stuck_is_named(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hold_up", "fail_rank=0", SHORT)
    assert proc.returncode == 1, proc.stderr
    assert "rank 0 failed: NotInCollective: rank 1 waited for it in all_reduce" in proc.stdout
    assert f"  rank 0: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH})" in proc.stderr
    assert "  rank 1: waiting in all_reduce, at hold_up (" in proc.stderr
    assert leftover(seen(job_dirs(tmp_path)[0])) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("limit", [SHORT, "platform.timeout_min=0.03"], ids=["collective timeout", "time limit"])
def test_a_stopped_rank_is_named_as_the_one_that_holds_the_others_up(tmp_path: Path, limit: str) -> None:
    """A rank stopped (SIGSTOP, Ctrl-Z, a debugger) gives no stack, but its process is there: it is named, with its
    state, as the rank the others wait for, never as one that had ended; then it is killed as any rank is."""
    proc = run_app(tmp_path, "behaviour=hold_up_stopped", limit)
    assert proc.returncode == 1, proc.stderr
    assert "  rank 1: NOT ANSWERING, at an unknown place (it gave no stack: stopped, as by SIGSTOP, Ctrl-Z or a " \
           "debugger)" in proc.stderr
    assert "  rank 0: waiting in all_reduce, at hold_up (" in proc.stderr
    assert "had ended" not in proc.stderr
    if limit == SHORT:
        assert "rank 1 failed: NotInCollective: rank 0 waited for it in all_reduce" in proc.stdout
    assert leftover(seen(job_dirs(tmp_path)[0])) == []


@pytest.mark.subprocess
def test_a_multirun_job_names_the_rank_outside_the_collective_in_its_summary(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "-m", "behaviour=hold_up", SHORT)
    assert proc.returncode == 1, proc.stderr
    assert f"  rank 1: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH})" in proc.stderr
    (summary,) = tmp_path.rglob("sweep_summary.json")
    (entry,) = json.loads(summary.read_text())["jobs"]
    assert entry["error"].startswith("rank 1 failed: NotInCollective: rank 0 waited for it in all_reduce")
    assert "rank 1 failed: NotInCollective" in proc.stdout  # the summary table


@pytest.mark.subprocess
def test_a_multirun_job_past_its_time_limit_names_the_rank_that_held_it_up_as_it_ends(tmp_path: Path) -> None:
    """In a sweep only the first failed job's error is printed: each job's FAILED line (stdout) and its summary entry
    say where each rank was (they said only that the time limit passed)."""
    proc = run_app(tmp_path, "-m", "behaviour=hold_up", "platform.timeout_min=0.03")
    assert proc.returncode == 1, proc.stderr
    assert f"  rank 1: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH})" in proc.stdout
    assert "  rank 0: waiting in all_reduce, at hold_up (" in proc.stdout
    (summary,) = tmp_path.rglob("sweep_summary.json")
    (entry,) = json.loads(summary.read_text())["jobs"]
    assert entry["error"].startswith("JobTimedOut: the job ran past its time limit (platform.timeout_min=0.03) and "
                                     f"was stopped; rank 1 held up the others, at load_batch ({APP}:{LOAD_BATCH})")


@pytest.mark.subprocess
def test_the_time_limit_names_the_rank_outside_the_collective(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hold_up", "platform.timeout_min=0.03")
    assert proc.returncode != 0
    assert "ran past its time limit (platform.timeout_min=0.03) and was stopped; where each rank was" in proc.stderr
    assert f"  rank 1: NOT IN THE COLLECTIVE, at load_batch ({APP}:{LOAD_BATCH})" in proc.stderr
    assert "  rank 0: waiting in all_reduce, at hold_up (" in proc.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", [(), ("-m",)], ids=["plain run", "multirun"])
def test_a_running_job_says_where_each_rank_is_when_asked_and_goes_on(tmp_path: Path, mode: tuple) -> None:
    proc = start_app(tmp_path, *mode, "behaviour=hang")
    wait_for(lambda: bool(job_dirs(tmp_path)) and len(seen(job_dirs(tmp_path)[0])) == 2 or proc.poll() is not None,
             what="the ranks to start")
    asked = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert asked.returncode == 0, asked.stderr
    job = job_dirs(tmp_path)[0]
    assert f"{job}:" in asked.stdout
    assert "  where each rank was (asked); every thread's stack: " in asked.stdout
    assert f"    rank 1: NOT IN THE COLLECTIVE, at misbehave ({APP}:" in asked.stdout
    assert "    rank 0: waiting in barrier, at main (" in asked.stdout
    assert "in misbehave" in (job / "stacks_rank_1.txt").read_text()
    assert "in barrier" in (job / "stacks_rank_0.txt").read_text()
    assert not (job / "where.request").exists()  # answered: the request is gone, nothing left once the job ends
    assert not list(job.glob("where_node_*.answer"))  # nor its answer, once read (it stayed in the job's output dir)
    assert proc.poll() is None  # it goes on
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert "[ddpw] where each rank was (asked)" in stderr and "[ddpw]   rank 1: NOT IN THE COLLECTIVE" in stderr


@pytest.mark.subprocess
def test_asking_where_leaves_nothing_in_the_folder_of_a_job_that_had_ended(tmp_path: Path) -> None:
    """Asking a finished sweep's folder wrote `where.request` into every job's dir and left it there (nobody
    answers it)."""
    assert run_app(tmp_path, "-m", "behaviour=ok,ok").returncode == 0
    before = {job: sorted(job.rglob("*")) for job in job_dirs(tmp_path)}
    assert len(before) == 2
    asked = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert asked.returncode == 1 and "no running job answered" in asked.stderr, asked.stderr
    assert {job: sorted(job.rglob("*")) for job in job_dirs(tmp_path)} == before


@pytest.mark.subprocess
def test_asking_where_in_a_folder_that_is_missing_or_holds_no_job_says_so(tmp_path: Path) -> None:
    """A typo in RUN_DIR, or a folder without a job, read as "no running job answered" after the 5 s wait for
    answers, as if the job had ended."""
    (tmp_path / "empty").mkdir()
    missing, empty = (subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(tmp_path / name)],
                                     capture_output=True, text=True, timeout=60) for name in ("outptus", "empty"))
    assert missing.returncode == 1 and missing.stderr == \
        f"{tmp_path / 'outptus'}: no such folder; give a job's output dir, or a folder above it\n", missing.stderr
    assert empty.returncode == 1, empty.stderr
    assert empty.stderr.startswith(f"no job under {tmp_path / 'empty'} (no rank_<k>.log in it or below)"), empty.stderr


@pytest.mark.subprocess
def test_a_stalled_job_is_reported_once_and_goes_on(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hang", "platform.stall_timeout_min=0.02", "platform.timeout_min=0.1")
    assert proc.stderr.count("where each rank was (no rank wrote a line or moved for") == 1, proc.stderr
    assert "platform.stall_timeout_min=0.02)" in proc.stderr
    assert f"[ddpw]   rank 1: NOT IN THE COLLECTIVE, at misbehave ({APP}:" in proc.stderr
    assert "ran past its time limit (platform.timeout_min=0.1)" in proc.stderr  # it went on until then


@pytest.mark.subprocess
def test_a_stalled_job_stops_when_asked_to(tmp_path: Path) -> None:
    proc = run_app(tmp_path, "behaviour=hang", "platform.stall_timeout_min=0.02", "platform.stop_on_stall=true")
    assert proc.returncode == 1
    assert "the job made no progress and was stopped (platform.stop_on_stall=true); where each rank was (no rank " \
           "wrote a line or moved" in proc.stderr
    assert leftover(seen(job_dirs(tmp_path)[0])) == []


# ------------------------------------------------------------------ reading stacks (no process)
DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce
  File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/repo/train.py", line 82 in train
  File "/repo/train.py", line 95 in main
"""


def test_a_dump_is_read_as_the_main_threads_frames_and_its_collective() -> None:
    place = from_dump(3, "task output\n" + DUMP)
    assert place is not None and place.rank == 3
    assert place.frames[2] == Frame("/repo/train.py", 82, "train")
    assert place.waiting and place.call == "all_reduce"
    assert place.where() == "train (/repo/train.py:82) <- main (/repo/train.py:95)"
    assert from_dump(0, "no dump here") is None


def test_a_traceback_is_read_innermost_first() -> None:
    text = ('Traceback (most recent call last):\n  File "/repo/train.py", line 82, in train\n    dist.barrier()\n'
            '  File "/site-packages/torch/distributed/distributed_c10d.py", line 5356, in barrier\n'
            '    work.wait()\nRuntimeError: Timed out waiting 1800ms\n')
    place = from_traceback(0, text)
    assert place.call == "barrier" and place.frames[-1].function == "train"


def test_the_report_names_the_ranks_outside_the_collective_first() -> None:
    stuck = RankPlace(1, (Frame("/site-packages/torch/utils/data/dataloader.py", 1320, "_next_data"),
                          Frame("/repo/train.py", 57, "train")))
    waiting = from_dump(0, DUMP)
    assert waiting is not None
    report = HangReport("asked", (waiting, stuck), "out/stacks_rank_<k>.txt", ended=(2,))
    assert (report.culprits, report.waiting) == ([1], [0])
    assert report.lines() == [
        "rank 1: NOT IN THE COLLECTIVE, at train (/repo/train.py:57), inside _next_data "
        "(/site-packages/torch/utils/data/dataloader.py:1320)",
        "rank 0: waiting in all_reduce, at train (/repo/train.py:82) <- main (/repo/train.py:95)",
        "rank 2: had ended",
    ]
    assert HangReport("asked", (stuck,)).culprits == []  # nobody waits: nobody holds anybody up


def test_a_rank_inside_a_library_is_shown_in_the_call_its_code_made_and_where_that_ended_up() -> None:
    """A rank whose DataLoader waits for a worker: its innermost frame alone (`select`) does not say it is the
    DataLoader; the call the user's code made does."""
    selectors = f"{sysconfig.get_paths()['stdlib']}/selectors.py"
    stuck = RankPlace(1, (Frame(selectors, 415, "select"),
                          Frame("/site-packages/torch/utils/data/dataloader.py", 1133, "_try_get_data"),
                          Frame("/site-packages/torch/utils/data/dataloader.py", 733, "__next__"),
                          Frame("/repo/train.py", 58, "train")))
    assert stuck.where() == ("train (/repo/train.py:58), inside __next__ (/site-packages/torch/utils/data/"
                             f"dataloader.py:733) ... select ({selectors}:415)")


def _dump(*entries: tuple[str, int, str]) -> bytes:
    """A flight-recorder dump as torch pickles it, of collectives (name, sequence number, group)."""
    return pickle.dumps({"version": "2.10", "entries": [
        {"record_id": i, "process_group": (group, "default_pg" if group == "0" else "layout"),
         "collective_seq_id": seq, "profiling_name": f"gloo:{name}", "is_p2p": False}
        for i, (name, seq, group) in enumerate(entries)]})


def test_a_flight_recorder_dump_is_read_as_each_groups_last_collective(tmp_path: Path) -> None:
    (tmp_path / "fr_rank_0").write_bytes(_dump(("all_reduce", 1, "0"), ("broadcast", 1, "1"), ("barrier", 2, "0")))
    (tmp_path / "fr_rank_1").write_bytes(b"")  # armed, never dumped
    (tmp_path / "fr_rank_2").write_bytes(pickle.dumps(Frame("x", 1, "f")))  # names a class: not read
    (recorded,) = recorded_in(tmp_path, range(4))
    assert recorded.last == (Collective("broadcast", 1, "1", "layout"), Collective("barrier", 2, "0"))
    assert recorded.entered == (Collective("all_reduce", 1, "0"), *recorded.last)
    assert str(recorded.in_group("1")) == "broadcast #1 of group layout"


def test_the_report_names_each_ranks_last_collective_and_the_one_the_culprit_is_not_in() -> None:
    waiting = from_dump(0, DUMP)
    stuck = RankPlace(1, (Frame("/repo/train.py", 57, "train"),))
    assert waiting is not None
    recorded = (Recorded(0, (Collective("all_reduce", 12, "0"),)), Recorded(1, (Collective("barrier", 11, "0"),)))
    report = HangReport("asked", (waiting, stuck), recorded=recorded, recorder="out/fr_rank_<k>")
    assert report.awaited == Collective("all_reduce", 12, "0")
    assert report.lines() == [
        "rank 1: NOT IN THE COLLECTIVE, at train (/repo/train.py:57); collectives: last entered barrier #11, "
        "not all_reduce #12",
        "rank 0: waiting in all_reduce, at train (/repo/train.py:82) <- main (/repo/train.py:95); collectives: "
        "last entered all_reduce #12",
    ]
    assert report.text().splitlines()[0] == "where each rank was (asked); each rank's last collectives: " \
                                            "out/fr_rank_<k>:"


def test_a_group_the_task_made_is_named_by_torchs_name_and_a_culprit_outside_it_by_its_last_collective() -> None:
    """A group made by `dist.new_group()` without `group_desc` (torch describes it as `undefined`) that a rank never
    entered: the report said `collectives: none entered, not all_reduce #1 of group undefined` for a rank that had
    entered the world group's collectives."""
    waiting = from_dump(0, DUMP)
    stuck = RankPlace(1, (Frame("/repo/train.py", 57, "train"),))
    assert waiting is not None
    world = (Collective("broadcast", 3, "0"), Collective("all_reduce", 4, "0"))
    subgroup = Collective("all_reduce", 1, "1", "undefined")
    recorded = (Recorded(0, (world[-1], subgroup), (*world, subgroup)), Recorded(1, world[-1:], world))
    report = HangReport("asked", (waiting, stuck), recorded=recorded)
    assert report.awaited == subgroup
    assert report.lines()[0].endswith("; collectives: last entered all_reduce #4, not all_reduce #1 of group 1")
    assert report.lines()[1].endswith("; collectives: last entered all_reduce #1 of group 1")


def test_the_collective_awaited_is_the_first_the_culprit_missed_when_the_waiting_ranks_enqueued_more() -> None:
    """NCCL's collectives are asynchronous: a rank waiting for a peer has enqueued the collectives after the one it
    waits in (seen on a GPU: `all_reduce #3`, then the `barrier`'s `all_reduce_barrier #4`)."""
    waiting = from_dump(0, DUMP)
    stuck = RankPlace(1, (Frame("/repo/train.py", 57, "train"),))
    assert waiting is not None
    entered = (Collective("all_reduce", 2, "0"), Collective("all_reduce", 3, "0"),
               Collective("all_reduce_barrier", 4, "0"))
    recorded = (Recorded(0, entered[-1:], entered), Recorded(1, entered[:1], entered[:1]))
    report = HangReport("asked", (waiting, stuck), recorded=recorded)
    assert report.awaited == Collective("all_reduce", 3, "0")
    assert report.lines()[0].endswith("; collectives: last entered all_reduce #2, not all_reduce #3")


def test_the_launcher_plugin_that_forks_a_multiruns_ranks_is_not_named_as_the_users_code() -> None:
    import hydra_plugins.hydra_ddpw_launcher.local_launcher as plugin

    place = RankPlace(1, (Frame("/repo/train.py", 57, "train"), Frame(plugin.__file__, 36, "setup")))
    assert place.where() == "train (/repo/train.py:57)", place.where()


# ------------------------------------------------------------------ whose code a frame is; a DataLoader's workers
def _installed_as_by_pip(folder: Path, name: str, files: dict[str, str], installed: str = "dist-info") -> None:
    """`files` (path: text) in `folder`, and the record an installer leaves beside them: `pip install --target
    folder` (a `*.dist-info` with its RECORD), or, `installed="egg-info"`, a legacy `setup.py install`."""
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    record = folder / f"{name}-1.0.{installed}"
    record.mkdir(parents=True)
    if installed == "dist-info":
        (record / "RECORD").write_text("".join(f"{path},sha256=x,1\n" for path in files) + f"{record.name}/RECORD,,\n")
    else:
        (record / "installed-files.txt").write_text("".join(f"../{path}\n" for path in files))


def test_a_library_installed_outside_site_packages_is_not_the_users_code_but_an_editable_project_is(
        tmp_path: Path) -> None:
    """`pip install --target DIR` (with PYTHONPATH=DIR), a legacy egg install: their frames were shown as the user's
    (`at fetch (.../deps/slowlib/__init__.py:6) <- load (train.py:29)`). A project installed editable keeps its
    own: its dist-info lists only its hook (pip), or its egg-info beside its code lists no installed file."""
    _installed_as_by_pip(tmp_path / "deps", "slowlib", {"slowlib/__init__.py": "", "slowlib/io.py": ""})
    _installed_as_by_pip(tmp_path / "deps", "six", {"six.py": ""})
    _installed_as_by_pip(tmp_path / "old", "oldlib", {"oldlib/__init__.py": ""}, installed="egg-info")
    _installed_as_by_pip(tmp_path / "venv", "mine", {"__editable__.mine-1.0.pth": "", "__editable___finder.py": ""})
    (tmp_path / "repo/src/mine.egg-info").mkdir(parents=True)  # `setup.py develop`'s, beside the project's code
    (tmp_path / "repo/src/mine.egg-info/SOURCES.txt").write_text("src/mine/__init__.py\nsrc/mine/data.py\n")
    (tmp_path / "repo/src/mine.egg-info/top_level.txt").write_text("mine\n")
    train, data = f"{tmp_path}/repo/train.py", f"{tmp_path}/repo/src/mine/data.py"
    for library in (f"{tmp_path}/deps/slowlib/io.py", f"{tmp_path}/deps/six.py", f"{tmp_path}/old/oldlib/__init__.py"):
        place = RankPlace(1, (Frame(library, 6, "fetch"), Frame(data, 12, "load"), Frame(train, 29, "main")))
        assert place.where() == f"load ({data}:12) <- main ({train}:29), inside fetch ({library}:6)", place.where()
    assert all(Frame(path, 1, "f").is_users for path in (train, data, f"{tmp_path}/deps/slowlib-io.py", "train.py"))


def test_a_dataloader_worker_is_named_at_its_batch_not_at_the_ranks_frames_it_forked_from_nor_when_idle() -> None:
    torch = "/site-packages/torch/utils/data"
    below = (Frame(f"{torch}/_utils/worker.py", 374, "_worker_loop"), Frame("/repo/train.py", 38, "main"))
    making = (Frame("/repo/train.py", 22, "__getitem__"), Frame(f"{torch}/_utils/fetch.py", 54, "fetch"), *below)
    idle = (Frame("/usr/lib/python3.11/multiprocessing/queues.py", 113, "get"), *below)
    worker = WorkerPlace.of(4242, making)
    assert worker == WorkerPlace(4242, making[:3]) and WorkerPlace.of(4243, idle) is None
    assert WorkerPlace.of(4244, making[:2]) is None  # (not a DataLoader's worker)
    other = WorkerPlace(4245, (Frame("/repo/train.py", 25, "__getitem__"), *making[1:3]))
    rank_1 = RankPlace(1, (Frame(f"{torch}/dataloader.py", 725, "__next__"), Frame("/repo/train.py", 38, "main")),
                       workers=(worker, other, replace(worker, pid=4246)))
    # (not `inside __next__ (.../dataloader.py:725) ... select (...)` too: a summary shows its first 300 characters)
    assert rank_1.where() == ("main (/repo/train.py:38); rank 1's DataLoader workers (pids 4242, 4246) at __getitem__ "
                              "(/repo/train.py:22); rank 1's DataLoader worker (pid 4245) at __getitem__ "
                              "(/repo/train.py:25)")


_STUCK_WORKER_APP = '''
import os
import time

import hydra
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import ddpw_runtime
from mine.data import Batches


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    if ddpw_runtime.rank() == 1:
        batches = iter(DataLoader(Batches(), batch_size=2, num_workers=1))  # (its worker starts on the first batch)
        dist.all_reduce(torch.ones(2))
        open("entered", "w").close()
        dist.all_reduce(next(batches))
    else:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2))


if __name__ == "__main__":
    main()
'''
_DATASET = '''
import os

import slowlib
import torch


class Batches(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        open(f"stuck_{os.getpid()}", "w").close()
        return slowlib.fetch(index)
'''
_LIBRARY = '''
import time


def fetch(index):
    while True:
        time.sleep(0.1)
'''


@pytest.mark.subprocess
def test_a_rank_waiting_for_its_dataloader_names_the_workers_line_in_the_users_dataset(tmp_path: Path) -> None:
    """Rank 1's DataLoader waits for its worker, stuck in a library (installed with `pip install --target deps`) that
    the user's Dataset (a package of the repo, with `setup.py develop`'s egg-info beside it) calls. The report
    said only `at main (app.py:17), inside __next__ (.../dataloader.py:...) ... select (...)`."""
    _installed_as_by_pip(tmp_path / "deps", "slowlib", {"slowlib/__init__.py": _LIBRARY})
    (tmp_path / "repo/mine").mkdir(parents=True)
    (tmp_path / "repo/mine.egg-info").mkdir()
    (tmp_path / "repo/mine.egg-info/SOURCES.txt").write_text("mine/__init__.py\nmine/data.py\n")
    (tmp_path / "repo/mine/__init__.py").write_text("")
    (tmp_path / "repo/mine/data.py").write_text(_DATASET)
    (tmp_path / "repo/app.py").write_text(_STUCK_WORKER_APP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "deps"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "app.py", "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"],
                            cwd=tmp_path / "repo", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: (any((tmp_path / "repo").glob("stuck_*")) and (tmp_path / "repo/entered").exists())
                 or proc.poll() is not None, what="the worker and rank 1's first all_reduce")
        (worker,) = [int(path.name.split("_")[1]) for path in (tmp_path / "repo").glob("stuck_*")]
        asked = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(tmp_path / "repo")],
                               capture_output=True, text=True, timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert asked.returncode == 0, asked.stderr + stderr
    (line,) = [line for line in asked.stdout.splitlines() if line.startswith("    rank 1: ")]
    app, data, library = (tmp_path / "repo/app.py", tmp_path / "repo/mine/data.py", tmp_path / "deps/slowlib")
    # its worker, and the rank's own collectives (not those of the worker's copy of its flight recorder, from before
    # the rank's first all_reduce, which the worker, asked for its stacks, wrote over the rank's dump)
    assert line == f"    rank 1: NOT IN THE COLLECTIVE, at main ({app}:20) <- <module> ({app}:27); rank 1's " \
                   f"DataLoader worker (pid {worker}) at __getitem__ ({data}:14), inside fetch " \
                   f"({library}/__init__.py:7); collectives: last entered all_reduce #1", line
    assert "    rank 0: waiting in all_reduce, at main (" in asked.stdout
    # the worker dumped the thread the signal came to, not every thread (reading its queue feeder's stack as it runs
    # could crash it), after rank 1's dump of every thread
    stacks = next((tmp_path / "repo").rglob("stacks_rank_1.txt")).read_text()
    assert stacks.index("Current thread 0x") < stacks.index("\nStack (most recent call first):\n"), stacks


_RANK_0_WORKER_APP = '''
import os
import time

import hydra
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import ddpw_runtime
from ddpw_runtime.launch.plan import DUMP_SIGNAL


def catches_the_stack_request():
    caught = next(line for line in open("/proc/self/status") if line.startswith("SigCgt:")).split()[1]
    return int(caught, 16) >> (DUMP_SIGNAL - 1) & 1


class Batches(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        open(f"stuck_{os.getpid()}", "w").close()
        while not os.path.exists("release"):
            time.sleep(0.05)
        return torch.ones(1)


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    if ddpw_runtime.rank() == 0:
        dist.all_reduce(next(iter(DataLoader(Batches(), batch_size=2, num_workers=1))))
    else:
        dist.all_reduce(torch.ones(2, 1))


if __name__ == "__main__":
    main()
    child = os.fork()  # the program's own fork, after its run: none of hydra-ddpw's handling
    if child == 0:
        open("forked_after_the_run", "w").write(str(catches_the_stack_request()))
        os._exit(0)
    os.waitpid(child, 0)
'''


@pytest.mark.subprocess
def test_rank_0_of_a_plain_run_waiting_for_its_dataloader_names_the_workers_line(tmp_path: Path) -> None:
    """Rank 0 of a plain run (the program's own process) waits for its DataLoader's worker, stuck in the user's
    Dataset: its line ended at `inside __next__ (.../dataloader.py:...) ... select (...)` (the processes rank 0 forked
    dropped the stack dump), as the other ranks' no longer do. What the program forks after its run still drops it.
    (Not hung for ever: the test lets the worker go once it was asked, and the run completes.)"""
    (tmp_path / "app.py").write_text(_RANK_0_WORKER_APP)
    proc = subprocess.Popen([sys.executable, "app.py", "hydra/launcher=ddpw_cpu", "platform.n_procs_per_node=2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(tmp_path.glob("stuck_*")) or proc.poll() is not None, what="rank 0's worker")
        (worker,) = [int(path.name.split("_")[1]) for path in tmp_path.glob("stuck_*")]
        asked = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", str(tmp_path)],
                               capture_output=True, text=True, timeout=60)
    finally:
        (tmp_path / "release").touch()
        stdout, stderr = proc.communicate(timeout=60)
    assert asked.returncode == 0, asked.stderr + stderr
    (line,) = [line for line in asked.stdout.splitlines() if line.startswith("    rank 0: ")]
    app, lines = tmp_path / "app.py", _RANK_0_WORKER_APP.splitlines()
    main, module, item = (lines.index(text) + 1 for text in (
        "        dist.all_reduce(next(iter(DataLoader(Batches(), batch_size=2, num_workers=1))))", "    main()",
        "            time.sleep(0.05)"))
    assert line == f"    rank 0: NOT IN THE COLLECTIVE, at main ({app}:{main}) <- <module> ({app}:{module}); " \
                   f"rank 0's DataLoader worker (pid {worker}) at __getitem__ ({app}:{item})", line
    assert proc.returncode == 0, stdout + stderr  # (the worker, asked, went on: its batch was all-reduced)
    # the worker dumped the thread the signal came to, not every thread (reading its queue feeder's stack as it runs
    # could crash it), after rank 0's dump of every thread
    (job,) = job_dirs(tmp_path)
    stacks = (job / "stacks_rank_0.txt").read_text()
    assert stacks.index("Current thread 0x") < stacks.index("\nStack (most recent call first):\n"), stacks
    assert (tmp_path / "forked_after_the_run").read_text() == "0"
