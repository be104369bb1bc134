"""Each node's controller in a job across machines without SLURM (docs/multi-node.md). Node 0 publishes the job
(`Nodes.lead`), waits (bounded) for the other nodes, runs its ranks and gathers every node's end (`Nodes.gathered`),
so the root cause across nodes is shown on its console; every other node follows it (`procs/node.py`). A stop on any
node is published in the job's store, and each node's watcher thread stops its ranks when it sees one."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ddpw_runtime.errors import JobTimedOut, NodeError, NodeLost, Terminated
from ddpw_runtime.launch.bounds import KILL_WAIT_S
from ddpw_runtime.launch.children import Child
from ddpw_runtime.launch.console import ConsoleRanks
from ddpw_runtime.launch.job import Grace
from ddpw_runtime.launch.outcome import note_failures, root_cause
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.signals import held, send_to_group
from ddpw_runtime.launch.stacks import shown_ranks
from ddpw_runtime.launch.supervisor import NodeRanks, OutsideRank, supervise
from ddpw_runtime.nodes.channel import JobSpec, NodeChannel, NodeStop

if TYPE_CHECKING:
    from ddpw_runtime.launch.job import LocalJob
    from ddpw_runtime.launch.protocol import JobStarting

_WATCH_S = 0.1  # how often each node's watcher looks for a stop from another node
_END_MARGIN_S = 10.0  # what node 0 waits for the other nodes' ends beyond their grace and kill bound
_PUBLISH_TRIES = 3  # tries to publish an interruption when more Ctrl-C or SIGTERM cut a try short


class _RanksOfANode(NodeRanks):
    """A node's ranks across machines: an interruption here is published first, so every other node stops too."""

    def __init__(self, nodes: Nodes, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = nodes

    def interrupt(self, sig: int) -> None:
        """Publish the stop, whole, then pass `sig` on as `NodeRanks.interrupt`; a second Ctrl-C or SIGTERM meanwhile
        kills the ranks at once, as it does there."""
        again = False
        for _ in range(_PUBLISH_TRIES):
            try:
                with held():
                    self.nodes.stop(NodeStop(self.local.plan.node_rank, sig))
                break
            except (KeyboardInterrupt, Terminated):  # it came before `held` took the signals
                again = True
        if not again:
            super().interrupt(sig)
            return
        self.send(sig)
        self.kill()

    def signal(self, child: Child, sig: int, group: bool) -> None:
        """Another node's Ctrl-C reaches rank 0 in the user's own process too: no terminal here sent it one."""
        if self.nodes.seen is not None and self.outside is not None and child.pid == self.outside.pid:
            send_to_group(child.pid, sig, group=False)
        else:
            super().signal(child, sig, group)


def lead(local: LocalJob, console: ConsoleRanks, starting: JobStarting) -> list[RankOutcome]:
    """Node 0 of `local`'s job across machines (a multirun's job process): its ranks, then every node's outcomes."""
    nodes = Nodes.lead(local.host_store(), local, starting)
    ranks = nodes.ranks(local, console, local.drop_store)
    with nodes.watching(ranks):
        outcomes = supervise(ranks)
    return nodes.gathered(outcomes)


class Nodes:
    """This node's part in a job's nodes: nothing for a job of one node (`channel` None)."""

    def __init__(self, channel: NodeChannel | None, grace: Grace) -> None:
        self.channel = channel
        self.grace = grace
        self.seen: NodeStop | None = None  # the stop another node published, once this node's watcher saw it
        self.seen_at = float("inf")  # when (`time.time()`, as a rank stamps its end)

    @staticmethod
    def lead(store: Any, local: LocalJob, starting: JobStarting) -> Nodes:
        """Node 0: publish the job and wait for the other nodes, at most `platform.join_timeout_min`; NodeError
        naming those that never joined."""
        plan = local.plan
        platform = plan.platform
        if platform.n_nodes == 1:
            return Nodes(None, local.job.grace)
        channel = NodeChannel(store, 0, platform.n_nodes, f"{plan.master_addr}:{plan.master_port}")
        state = starting.state
        env_set = {k: v for k, v in state.env.items() if os.environ.get(k) != v}  # what the job set in rank 0's
        job_cwd = state.cwd if state.cwd != os.getcwd() else None
        channel.publish(JobSpec(platform, starting.task, state.hydra_state, env_set, job_cwd, starting.log_dir,
                                plan.run_id, starting.overrides))
        missing = channel.missing(platform.join_timeout_min)
        stopped = channel.stopped()
        if stopped is not None and stopped.lost:  # a node fell silent (it had joined, or it followed the sweep)
            others = [node for node in missing if node != stopped.node]
            raise NodeLost(stopped.text() + (f"; node(s) {', '.join(map(str, others))} had not joined yet"
                                             if others else ""), [stopped.node])
        if stopped is not None:  # a node got Ctrl-C or SIGTERM before it joined, or runs another command (never joins)
            raise (NodeLost if stopped.why is not None else NodeError)(stopped.text())
        if missing:
            never = (f"node(s) {', '.join(map(str, missing))} of {platform.n_nodes} never joined within "
                     f"platform.join_timeout_min={platform.join_timeout_min:g} (node 0 waited at {channel.where}): "
                     "start the same command on each machine (its platform.node_rank, or its platform's variables, "
                     "saying which node it is), and check that it reaches this address and port")
            channel.stop_job(NodeStop(0, why=never))  # (the nodes that joined say why, not that a rank failed)
            raise NodeLost(never, missing)
        return Nodes(channel, local.job.grace)

    def ranks(self, local: LocalJob, console: ConsoleRanks, on_stop: Callable[[], None] = lambda: None,
              outside: OutsideRank | None = None) -> NodeRanks:
        """This node's ranks of `local` (see `NodeRanks`); across nodes, a stop here is published."""
        if self.channel is None:
            return NodeRanks(local, local.plan.global_ranks, console, on_stop, outside)
        node = local.plan.node_rank

        def stopping() -> None:
            on_stop()
            self.stop(NodeStop(node))

        return _RanksOfANode(self, local, local.plan.global_ranks, console, stopping, outside)

    def stop(self, stop: NodeStop) -> None:
        """Publish `stop` (unless this node stops only because another did)."""
        if self.channel is not None and self.seen is None:
            self.channel.stop_job(stop)

    @contextmanager
    def watching(self, ranks: NodeRanks) -> Iterator[None]:
        """While the block runs, a thread stops `ranks` when another node stops the job or can no longer be reached
        (node 0 counts one silent for `SILENT_S` as lost)."""
        channel = self.channel
        if channel is None:
            yield
            return
        done = threading.Event()

        def watch() -> None:
            stop: NodeStop | None = None
            while not done.wait(_WATCH_S):
                news = channel.stopped()
                if channel.node != 0:  # (it beats, from its join until its end is sent, or node 0 is gone)
                    if channel.lost:
                        done.set()
                else:
                    if news is None and (silent := channel.silent()):
                        news = channel.lost_stop(silent[0])
                        channel.stop_job(news)
                    if news is not None:
                        done.set()
                if news is not None and stop is None:
                    stop = news
                    if stop.node != channel.node:  # another node's Ctrl-C or SIGTERM is passed on, as this node's
                        self.seen, self.seen_at = stop, time.time()
                        ranks.request_stop(stop.signal)

        watcher = threading.Thread(target=watch, name="ddpw-nodes", daemon=True)
        watcher.start()
        try:
            yield
        except JobTimedOut as here:  # node 0 shows where every node's ranks were; another node, its own
            if channel.node != 0:
                raise
            ends = channel.ends(self._ends_within_s)[0].values()
            raise with_every_node(here, [o for end in ends for o in end.ranks], [end.error for end in ends]) from None
        except (KeyboardInterrupt, Terminated):
            if channel.node == 0:  # the other nodes read why (the stop published) before node 0's store goes
                channel.ends(self._ends_within_s)
            raise
        finally:
            done.set()
            watcher.join(timeout=5.0)

    @property
    def _ends_within_s(self) -> float:
        """How long node 0 waits for the other nodes' ends."""
        return self.grace.interrupt_s + KILL_WAIT_S + _END_MARGIN_S

    def gathered(self, outcomes: list[RankOutcome]) -> list[RankOutcome]:
        """Node 0, after its ranks ended: every node's outcomes in rank order, once each other node sent its end or fell
        silent (bounded). NodeError when a node was interrupted, failed, was lost, or sent nothing."""
        if self.channel is None:
            return outcomes
        ends, lost = self.channel.ends(self._ends_within_s)
        for end in ends.values():
            if end.interrupted is not None:  # (that node noted how its ranks ended; each node notes its own then)
                note_failures(outcomes)
                raise NodeError(NodeStop(end.node, end.interrupted).text())
        if self.seen is not None and self.seen.lost:  # this node's ranks were stopped for it: how they ended is not it
            raise NodeLost(self.seen.text(), sorted({self.seen.node, *lost}))
        every = sorted([*outcomes, *(o for end in ends.values() for o in end.ranks)], key=lambda o: o.rank)
        if failed_by_itself(every):  # a rank's own failure, on any node
            return every
        errors = [end.error for end in ends.values() if end.error is not None]
        if errors:
            if isinstance(errors[0], JobTimedOut):  # another node's time limit came first: this one's ranks too
                raise with_every_node(errors[0], every, errors)
            raise errors[0]
        if lost:  # (once this node's ranks had ended)
            raise NodeLost(self.channel.lost_stop(lost[0]).text(), lost)
        missing = [node for node in range(1, self.channel.n_nodes) if node not in ends]
        if missing:
            raise NodeError(f"node(s) {', '.join(map(str, missing))} sent no end of their ranks (their controller "
                            "ended, or lost node 0)")
        return every


def with_every_node(timed_out: JobTimedOut, outcomes: Iterable[RankOutcome],
                    errors: Iterable[BaseException | None]) -> JobTimedOut:
    """`timed_out` (one node's time limit or stall) with where every other rank was, from the ranks' `outcomes` and
    the other nodes' `errors` (their own time limit's), so the report names the ranks that held the others up on
    whichever node they ran."""
    report = timed_out.report
    if report is None:
        return timed_out
    places = {place.rank: place for place in report.places}
    ended, recorded = set(report.ended), list(report.recorded)
    for error in errors:
        theirs = error.report if isinstance(error, JobTimedOut) and error is not timed_out else None
        if theirs is not None:
            places.update({place.rank: place for place in theirs.places if place.rank not in places})
            ended.update(theirs.ended)
            recorded.extend(theirs.recorded)
    for outcome in outcomes:  # (a rank that failed as its peers went, where it waited: its traceback's place)
        if (place := outcome.where()) is not None:
            places.setdefault(outcome.rank, place)
        ended.add(outcome.rank)
    whole = replace(report, places=tuple(places[rank] for rank in sorted(places)),
                    ended=tuple(sorted(ended - places.keys())), recorded=tuple(recorded))
    return JobTimedOut(timed_out.timeout_min, shown_ranks(whole.places), whole, timed_out.stalled, timed_out.warned)


def failed_by_itself(outcomes: list[RankOutcome], before: float = float("inf")) -> bool:
    """Whether the root cause among `outcomes` is a rank's own failure (not a stop, nor only a peer gone) that ended
    before `before` (when this node saw another node's stop: a failure after it may follow from it)."""
    cause = root_cause(outcomes)
    return (cause is not None and cause.own_failure and not cause.is_secondary
            and (cause.result.finished_at if cause.result is not None else cause.ended_at) < before)
