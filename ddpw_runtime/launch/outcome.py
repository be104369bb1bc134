"""The one rule that names the root cause of a failed job among how its ranks ended (`RankOutcome`), whichever
process or node the ranks ran in (docs/architecture.md, "The root cause, once"), and the `RankFailure` it makes."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from ddpw_runtime.errors import RankFailure
from ddpw_runtime.launch.plan import recorder_file, stacks_file
from ddpw_runtime.launch.rank_outcome import RankOutcome, log_tail, timeout_line
from ddpw_runtime.launch.recorded import recorded_in
from ddpw_runtime.launch.stacks import HangReport, rank_ranges


def root_cause(outcomes: Iterable[RankOutcome]) -> RankOutcome | None:
    """The rank whose failure explains the job's: among the failed ranks, those that failed on their own, then those
    whose failure does not merely say a peer went away, then the earliest; None when none failed."""
    failed = [o for o in outcomes if o.failed]
    if not failed:
        return None
    own = [o for o in failed if o.own_failure] or failed
    primary = [o for o in own if not o.is_secondary] or own
    return min(primary, key=lambda o: (o.result.finished_at if o.result is not None else o.ended_at))


def failure(outcomes: Sequence[RankOutcome]) -> RankFailure | None:
    """The `RankFailure` of a job whose ranks (any order, any nodes) ended as `outcomes`; None if all returned."""
    cause = root_cause(outcomes)
    if cause is None:
        return None
    error, outcomes = cause.error, sorted(outcomes, key=lambda o: o.rank)
    made = _held_up(outcomes, cause)
    if made is None or _task_returned(outcomes, made.rank):  # the rank the others waited for had returned
        made = _ended_early(outcomes, cause) or made
    if made is None:
        if error is not None:
            error_type, message, text, tail = error.type_name, error.message, error.traceback, ""
        else:
            error_type, message = describe_exit(cause.exit_code, returned=cause.result is not None)
            text, tail = "", log_tail(cause.log_file)
        made = _blaming(cause, outcomes, error_type, message, traceback_text=text, log_tail=tail)
    made.__cause__ = error.exception() if error is not None else None
    return made


def _blaming(rank: RankOutcome, outcomes: Sequence[RankOutcome], error_type: str, message: str,
             **details: Any) -> RankFailure:
    """The `RankFailure` whose root cause is `rank`, among every rank's `outcomes` (in rank order)."""
    return RankFailure(rank=rank.rank, node=rank.node, exit_code=rank.exit_code, error_type=error_type,
                       error_message=message, log_file=rank.log_file, outcomes=outcomes, **details)


def _held_up(outcomes: Sequence[RankOutcome], cause: RankOutcome) -> RankFailure | None:
    """When `cause`'s collective timed out: the `RankFailure` of the rank(s) not in it (where their stacks showed
    them), the ranks that waited as secondary; None otherwise, or when every rank looked at waited."""
    if not cause.timed_out_in_collective:
        return None
    places = tuple(place for place in (o.where() for o in outcomes) if place)
    ended = tuple(o.rank for o in outcomes if o.where() is None)
    log_dir = Path(cause.log_file).parent if cause.log_file else None
    stacks, recorder = ("", "") if log_dir is None else (
        str(stacks_file(log_dir, "<k>")), str(recorder_file(log_dir, "<k>")))
    recorded = () if log_dir is None else recorded_in(log_dir, (o.rank for o in outcomes))
    report = HangReport(f"rank {cause.rank}'s collective timed out", places, stacks, ended, recorded, recorder)
    if not report.culprits:
        return _mismatched(outcomes, cause, report)
    culprit = next(o for o in outcomes if o.rank == report.culprits[0])
    place = report.place(culprit.rank)
    assert place is not None  # a culprit was looked at
    waiting, awaited = report.waiting, report.awaited
    calls = [str(awaited)] if awaited is not None else sorted({p.call for p in report.places if p.waiting and p.call})
    return _blaming(
        culprit, outcomes, "NotInCollective", f"rank{'s' if len(waiting) > 1 else ''} {rank_ranges(waiting)} waited "
        f"for it in {', '.join(calls) or 'a collective'} until the collective timed out; it was at {place.where()}",
        hang=report,
        waiting_error=f"rank {cause.rank}: {cause.error.headline if cause.error else timeout_line(cause.log_file)}")


def _mismatched(outcomes: Sequence[RankOutcome], cause: RankOutcome, report: HangReport) -> RankFailure | None:
    """When every rank looked at waited as `cause`'s collective timed out, but not all in the same one: the
    `CollectiveMismatch` of a rank in the collective fewest ranks were in (`cause` first); None otherwise."""
    places = {place.rank: place for place in report.places if place.waiting}
    by_call: dict[str, list[int]] = {}
    for rank, place in places.items():
        by_call.setdefault(place.call or "a collective", []).append(rank)
    if len(by_call) < 2:
        return None
    fewest = min(by_call.values(), key=lambda ranks: (len(ranks), cause.rank not in ranks))
    culprit = next(o for o in outcomes if o.rank == (cause.rank if cause.rank in fewest else fewest[0]))
    calls = "; ".join(f"{'ranks' if len(ranks) > 1 else 'rank'} {rank_ranges(ranks)} in {call} at "
                      f"{places[ranks[0]].where()}" for call, ranks in sorted(by_call.items(), key=lambda it: it[1]))
    return _blaming(
        culprit, outcomes, "CollectiveMismatch", f"the ranks waited in different collectives until rank {cause.rank}'s "
        f"timed out ({calls}): every rank must enter the same collectives, in the same order",
        traceback_text=culprit.error.traceback if culprit.error is not None else "", hang=report,
        waiting_error="" if culprit is cause or cause.error is None else f"rank {cause.rank}: {cause.error.headline}")


def _task_returned(outcomes: Sequence[RankOutcome], rank: int) -> bool:
    """Whether `rank`'s task had returned (its value sent), whatever ended its process."""
    return any(o.rank == rank and o.result is not None and o.result.ok for o in outcomes)


def _ended_early(outcomes: Sequence[RankOutcome], cause: RankOutcome) -> RankFailure | None:
    """When `cause` failed only because a peer went away, or its collective timed out, and peers had returned by then:
    the first of them ended the job (`EndedEarly`), its task done while `cause` waited for it in a collective (uneven
    data); None otherwise. A peer that went away closed its connections; over NCCL its peers may instead wait for it
    until their collective times out."""
    if not (cause.is_secondary or cause.timed_out_in_collective) or cause.result is None or cause.error is None:
        return None
    failed_at = cause.result.finished_at
    early = sorted((o for o in outcomes if not o.failed and o.result is not None and o.result.finished_at <= failed_at),
                   key=lambda o: o.result.finished_at if o.result is not None else 0.0)
    if not early:
        return None
    first, place = early[0], cause.where()
    at = f" at {place.where()}" if place is not None else ""
    ended = (first.result.exited if first.result is not None else "") or "its task returned"
    return _blaming(
        first, outcomes, "EndedEarly", f"{ended} while rank {cause.rank} still waited for it in a collective{at}: "
        "every rank must enter the same collectives (as many batches on every rank, no early return on one)",
        waiting_error=f"rank {cause.rank}: {cause.error.headline}")


def describe_exit(code: int | None, returned: bool = False) -> tuple[str, str]:
    """(type, message) for a rank that ended without an exception of its own; `returned`: its task had returned (its
    value sent), so its exit went wrong as it ended (`procs/rank.py`, `_end_as_python_does`)."""
    if code is None:
        return "RankLost", "the rank ended without an exit status"
    if returned and code == -signal.SIGALRM:
        return "HungAtExit", ("its task returned, then it did not end within platform.exit_timeout_min: an atexit "
                              "handler (a tracker's upload, say) or closing a file it left open hung or took longer "
                              "(raise platform.exit_timeout_min if so); ended by SIGALRM, every thread's stack in its "
                              "log")
    after = " after its task returned, as it exited (in an atexit handler, or closing a file its task left open)"
    if code < 0:
        return "RankKilled", f"killed by {signal_name(-code)} (exit code {code}){after if returned else ''}"
    if code == 0:
        return "RankLost", "exited with code 0 but sent no result"
    return "RankExited", f"exited with code {code}{after if returned else ' before returning'}"


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; `signal N` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ends_a_line(fd: int) -> bool:
    """Whether the file open as `fd` (not empty) ends with a newline."""
    return os.pread(fd, 1, os.fstat(fd).st_size - 1) == b"\n"


def note_start(rank: int) -> re.Pattern[bytes]:
    """The start of `note_failures`'s note in rank `rank`'s log, with the newline that ends the line before it."""
    return re.compile(rb"\n--- rank %d (?:failed|was stopped): " % rank)


def note_failures(outcomes: Iterable[RankOutcome]) -> None:
    """Write what each failed rank raised at the end of its log (ranks do not print it: the console shows the root
    cause, not the errors that follow from it), how a rank the stop's signal killed ended, and how a rank that sent no
    result ended by itself (its exit code or signal)."""
    for outcome in outcomes:
        if outcome.log_file is None:
            continue
        if outcome.error is not None:
            ended = "was stopped" if outcome.ended_by_the_stop else "failed"
            note = f"{outcome.error.headline}\n{outcome.error.traceback}"
        elif outcome.stopped and not outcome.own_failure and outcome.exit_code is not None and outcome.exit_code < 0:
            ended, note = "was stopped", f"killed by {signal_name(-outcome.exit_code)}\n"
        elif outcome.result is None and outcome.own_failure and outcome.exit_code is not None:
            ended, note = "failed", "{}: {}\n".format(*describe_exit(outcome.exit_code))  # (exited, crashed, killed)
        else:
            continue
        with suppress(OSError), open(outcome.log_file, "a+", encoding="utf-8", errors="backslashreplace") as log:
            if log.tell() and not ends_a_line(log.fileno()):  # its last write had no newline: `print(.., end="")`
                log.write("\n")
            log.write(f"--- rank {outcome.rank} {ended}: {note}")
