"""The one root-cause rule (`ddpw_runtime.launch.outcome`), table-driven: a rank's own failure against a
rank the launcher stopped, a failure that only says a peer went away, a death by a signal the launcher
did or did not send, across the ranks of one node, across nodes, and with rank 0 in the caller's
process. No processes: the outcomes are built as the supervisors build them."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpw_runtime.errors import RankFailure
from ddpw_runtime.launch.outcome import failure, note_failures, root_cause
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.records import RaisedError, RankResult
from ddpw_runtime.launch.stacks import Frame, RankPlace

SENT = frozenset({signal.SIGTERM, signal.SIGKILL})
"""What the launcher sends when it stops ranks."""


def raised(rank: int, at: float, message: str = "bad batch", node: int = 0) -> RankOutcome:
    """Rank `rank` raised `message` at time `at` and exited 1 (exit None: it ran in the caller)."""
    result = RankResult(rank, error=RaisedError("ValueError", message, f"Traceback...\nValueError: {message}\n"),
                        finished_at=at)
    return RankOutcome(rank, node, result, None if rank == 0 and node == -1 else 1, ended_at=at)


def lost_peer(rank: int, at: float, node: int = 0) -> RankOutcome:
    """Rank `rank` failed at `at` because a peer went away (gloo's lost connection)."""
    return raised(rank, at, "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer", node)


def died(rank: int, code: int, at: float, stopped: bool = False, signals: frozenset = frozenset()) -> RankOutcome:
    """Rank `rank` ended with `code` and no result at `at`."""
    return RankOutcome(rank, 0, None, code, stopped, signals, ended_at=at)


def ok(rank: int, code: int | None = 0) -> RankOutcome:
    """Rank `rank` returned (and exited with `code`)."""
    return RankOutcome(rank, 0, RankResult(rank), code)


def caller(result: RankResult | None, stopped: bool = False, at: float = 0.0) -> RankOutcome:
    """Rank 0 in the caller's own process (no exit code); `result` None when it was stopped."""
    return RankOutcome(0, 0, result, None, stopped, ended_at=at)


@dataclass
class Case:
    id: str
    outcomes: Sequence[RankOutcome]
    cause: int | None
    """The rank the rule must name (None: nothing failed)."""


CASES = [
    Case("every rank returned", [ok(0), ok(1)], None),
    Case("a rank that raised", [ok(0), raised(1, 1.0)], 1),
    Case("own failure beats an earlier lost connection", [lost_peer(0, 1.0), raised(1, 2.0)], 1),
    Case("the earliest of two own failures", [raised(0, 2.0), raised(1, 1.0)], 1),
    Case("only lost connections: the earliest", [lost_peer(0, 2.0), lost_peer(1, 1.0)], 1),
    Case("killed by a signal the launcher did not send, against a stopped rank",
         [died(0, -signal.SIGTERM, 2.0, stopped=True, signals=SENT), died(1, -signal.SIGKILL, 1.0)], 1),
    Case("a stopped rank killed by the launcher's SIGKILL is not a cause",
         [died(0, -signal.SIGKILL, 1.0, stopped=True, signals=SENT), raised(1, 2.0)], 1),
    Case("a crash seen after the peer's exit (stopped, but a signal nobody sent) is the cause",
         [died(0, -signal.SIGSEGV, 2.0, stopped=True, signals=SENT), lost_peer(1, 1.0)], 0),
    Case("a stopped rank that raised while stopping still counts below an own failure",
         [raised(0, 3.0), died(1, 3, 1.0)], 1),
    Case("returned but crashed on its way out", [ok(0, code=-signal.SIGSEGV), ok(1)], 0),
    Case("across nodes: the own failure on node 1, not the earlier lost peer on node 0",
         [lost_peer(0, 1.0, node=0), raised(3, 2.0, node=1), raised(5, 3.0, "another", node=2)], 3),
    Case("the caller's rank 0 failed on its own first",
         [caller(RankResult(0, error=RaisedError("KeyError", "x", ""), finished_at=1.0), at=1.0), raised(1, 2.0)], 0),
    Case("the caller's rank 0 was stopped: the other rank is the cause",
         [caller(None, stopped=True, at=3.0), raised(1, 2.0)], 1),
    Case("the caller's rank 0 lost its peer: the other rank is the cause",
         [caller(lost_peer(0, 1.0).result, at=1.0), died(1, -signal.SIGKILL, 2.0)], 1),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_root_cause(case: Case) -> None:
    cause = root_cause(case.outcomes)
    assert (cause.rank if cause is not None else None) == case.cause
    made = failure(case.outcomes)
    assert (made.rank if made is not None else None) == case.cause


def test_the_failure_of_a_rank_that_raised_carries_its_traceback_and_every_outcome() -> None:
    made = failure([lost_peer(0, 1.0), raised(1, 2.0)])
    assert isinstance(made, RankFailure)
    assert (made.error_type, made.error_message, made.exit_code) == ("ValueError", "bad batch", 1)
    assert "ValueError: bad batch" in made.traceback_text and made.log_tail == ""
    assert [o.rank for o in made.outcomes] == [0, 1] and made.exit_codes == {0: 1, 1: 1}
    assert str(made).splitlines()[0] == "rank 1 (node 0) failed: ValueError: bad batch"


def test_a_message_of_megabytes_is_shown_whole_once_and_cut_where_a_line_names_the_cause() -> None:
    message = "x" * 2_000_000
    made = RankFailure(rank=1, node=0, exit_code=1, error_type="ValueError", error_message=message,
                       traceback_text=f"Traceback (most recent call last):\nValueError: {message}\n")
    assert made.cause == f"ValueError: {'x' * 300}... (1999700 characters more)"
    assert str(made).count(message) == 1 and len(str(made)) < len(message) + 1000


def test_the_failure_of_a_killed_rank_names_the_signal() -> None:
    made = failure([died(0, -signal.SIGTERM, 2.0, stopped=True, signals=SENT), died(1, -signal.SIGKILL, 1.0)])
    assert isinstance(made, RankFailure)
    assert (made.error_type, made.error_message) == ("RankKilled", "killed by SIGKILL (exit code -9)")


def test_a_rank_left_waiting_by_one_that_ended_early_is_placed_where_it_waited_not_where_it_was_ending() -> None:
    """3 ranks, DDP training, rank 2 one backward short: it returns, and rank 1's backward fails on the closed
    connection. Rank 1 still ran (sending its result, closing the files its task left open) when the job was stopped
    and its stack taken: the failure said rank 1 waited "at <module> (train.py:89), inside write_atomically
    (.../ddpw_runtime/launch/payload.py:108)"; it waited in its backward, where its traceback places it."""
    traceback_text = ('Traceback (most recent call last):\n  File "/w/train.py", line 41, in main\n    train(model)\n'
                      '  File "/w/train.py", line 16, in train\n    loss.backward()\n'
                      "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n")
    waiting = RankResult(1, error=RaisedError("RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed "
                                              "by peer", traceback_text), finished_at=2.0)
    ending = RankPlace(1, (Frame("/x/ddpw_runtime/launch/payload.py", 108, "write_atomically"),
                           Frame("/w/train.py", 89, "<module>")))
    ended_early = RankOutcome(2, 0, RankResult(2, finished_at=1.0), 0)
    made = failure([lost_peer(0, 3.0), RankOutcome(1, 0, waiting, -15, True, SENT, place=ending), ended_early])
    assert made is not None and (made.rank, made.error_type) == (2, "EndedEarly")
    assert made.error_message.startswith(
        "its task returned while rank 1 still waited for it in a collective at train (/w/train.py:16) <- main "
        "(/w/train.py:41): "), made.error_message


@pytest.mark.parametrize(("error", "stopped_at", "said"), [
    ("KeyboardInterrupt", None, "was stopped"), ("NameError", None, "failed"),
    ("SystemExit", 9.0, "was stopped"),  # (it raised at 10.0) a SIGTERM handler's sys.exit, after the stop came
    ("SystemExit", 11.0, "failed"),  # the task's own sys.exit(4), before: its peer's end began the stop
])
def test_a_stopped_rank_s_log_says_it_was_stopped_only_when_it_raised_what_the_stop_raises(
    tmp_path: Path, error: str, stopped_at: float | None, said: str
) -> None:
    """A rank the stop reached after it had raised an error of its own (both ranks hit the same bug, or its task
    called `sys.exit(4)` and its peer's end was seen first) failed; one whose task raised what the stop raises
    (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's exit) as the stop came was stopped."""
    log = tmp_path / "rank_1.log"
    result = RankResult(1, error=RaisedError(error, "", f"Traceback...\n{error}\n"), finished_at=10.0)
    note_failures([RankOutcome(1, 0, result, 1, True, SENT, log_file=str(log), stopped_at=stopped_at)])
    assert log.read_text().startswith(f"--- rank 1 {said}: {error}\n")


@pytest.mark.parametrize(("written", "kept"), [("", ""), ("a whole line\n", "a whole line\n"),
                                               ("a line without its newline", "a line without its newline\n")])
def test_what_a_failed_rank_raised_starts_a_line_of_its_log(tmp_path: Path, written: str, kept: str) -> None:
    log = tmp_path / "rank_1.log"
    log.write_text(written)
    result = RankResult(1, error=RaisedError("ValueError", "", "Traceback...\nValueError\n"))
    note_failures([RankOutcome(1, 0, result, 1, False, frozenset(), log_file=str(log))])
    assert log.read_text() == f"{kept}--- rank 1 failed: ValueError\nTraceback...\nValueError\n"
