"""A node other than 0 of a job across machines without SLURM (docs/multi-node.md), started with node 0's command.
It never runs Hydra's job: it follows node 0's (`follow`), running its ranks with node 0's spec."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from ddpw_conf import Platform
from ddpw_conf.launcher import LauncherOptions
from ddpw_runtime import _compat
from ddpw_runtime.errors import JobTimedOut, NodeError, Terminated
from ddpw_runtime.launch.job import Grace, NodeJob, local_job, starter_for
from ddpw_runtime.launch.outcome import failure, note_failures, root_cause
from ddpw_runtime.launch.records import portable
from ddpw_runtime.launch.signals import signal_of, sigterm_raises
from ddpw_runtime.launch.supervisor import supervise
from ddpw_runtime.nodes.channel import NodeChannel, NodeEnd, NodeStop, OtherCommand
from ddpw_runtime.nodes.controller import Nodes, failed_by_itself
from ddpw_runtime.nodes.sweep_channel import SweepChannel, stop_waiting_job


def follow_sweep(platform: Platform, options: LauncherOptions, overrides: tuple[str, ...]) -> int:
    """Node `platform.node_rank` (> 0) of a multirun across machines (`overrides` as typed here; those that differ
    from node 0's are named): follow node 0's sweep job by job until node 0 says it ended (0), or ended early or
    without saying so (`NodeError`). After Ctrl-C or SIGTERM here, 130 or 143, and node 0 starts no more jobs."""
    starter_for(platform)  # first: while this process has no other thread, the starter is a fork of it
    with sigterm_raises():
        try:
            sweep = SweepChannel.connect(platform)
        except (KeyboardInterrupt, Terminated) as stop:  # while it waits for node 0: nothing runs here yet
            return 128 + signal_of(stop)
        sweep.follow()  # (a process refused there never followed: it leaves nothing)
        try:
            return _follow_jobs(sweep, platform, options, overrides)
        finally:
            sweep.leave()


def _follow_jobs(sweep: SweepChannel, platform: Platform, options: LauncherOptions, overrides: tuple[str, ...]) -> int:
    job = 0
    while True:
        try:
            port = sweep.next_port(job, platform.join_timeout_min)
        except (KeyboardInterrupt, Terminated) as stop:
            sweep.stop(signal_of(stop))
            return 128 + signal_of(stop)
        if port is None:
            sys.stderr.write(f"[ddpw] node 0's sweep ended; this node (node {sweep.node}) ran its ranks of {job} "
                             "job(s); node 0 shows the sweep's summary\n")
            return 0
        if job == 0:  # (node 0 said its sweep's overrides as it started serving its store, before its first job)
            _say_differences(overrides, sweep.overrides(), sweep.node, options.platform_key)
        code, stopped = _follow(replace(platform, master_port=port), options)
        if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            sweep.stop(code - 128)
            return code
        if stopped is not None and stopped.signal is not None:  # another node's Ctrl-C or SIGTERM ends the sweep
            return code
        job += 1


def follow(platform: Platform, options: LauncherOptions, overrides: tuple[str, ...]) -> int:
    """Node `platform.node_rank` (> 0, placed by `place_node`) of a job across machines (`overrides` as typed here;
    those that differ from node 0's are named): run this node's ranks of the job node 0 publishes until they end or
    another node stops it; the exit code (0; 1 when the job failed or was stopped elsewhere; 130 or 143 after Ctrl-C
    or SIGTERM here). Node 0's console shows the job's report; this node's says what ended it here."""
    return _follow(platform, options, overrides)[0]


def _say_differences(here: tuple[str, ...], on_node_0: tuple[str, ...], node: int, platform_key: str) -> None:
    """Name the overrides that differ between `here` and node 0 (but those that place a node)."""
    placing = {f"{platform_key}.{name}" for name in ("node_rank", "master_addr", "master_port")}

    def kept(overrides: tuple[str, ...]) -> set[str]:
        return {o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in placing}

    only_here, only_there = sorted(kept(here) - kept(on_node_0)), sorted(kept(on_node_0) - kept(here))
    if only_here or only_there:
        sys.stderr.write(f"[ddpw] node {node} runs node 0's config, whose overrides differ from this node's: here "
                         f"{' '.join(only_here) or '(none)'}, on node 0 {' '.join(only_there) or '(none)'}\n")


def _writable_here(output_dir: str, channel: NodeChannel, node: int) -> None:
    """Make node 0's `output_dir` on this machine, where this node's ranks write their logs; where it cannot be made
    or written, stop the job on every node saying so (node 0 shows it), and raise that NodeError."""
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=output_dir).close()  # (a read-only file system, another user's dir: its error)
    except OSError as error:
        unusable = NodeError(f"node {node} cannot write its ranks' logs into the job's output dir {output_dir} on its "
                             f"machine ({error.strerror}): give every node a file system where it can write node 0's "
                             "output dir (a shared one, or the same path, writable, on each machine)")
        channel.stop_job(NodeStop(node, why=str(unusable)))
        channel.end(NodeEnd(node, error=unusable))
        raise unusable from None


def _follow(platform: Platform, options: LauncherOptions,
            overrides: tuple[str, ...] | None = None) -> tuple[int, NodeStop | None]:
    """`follow`'s exit code, and another node's stop that ended the job (None: none did); `overrides` None: not
    compared (a job of a sweep)."""
    node = platform.node_rank
    assert node
    starter_for(platform)  # first: while this process has no other thread, the starter is a fork of it
    channel: NodeChannel | None = None
    try:
        channel = NodeChannel.connect(platform, say_waiting=overrides is not None)
        spec = channel.spec(platform.join_timeout_min)
        channel.check_placed(spec.platform.n_nodes)  # (before it joins: node 0's job goes on without it)
        channel.join()
        if overrides is not None:
            _say_differences(overrides, spec.overrides, node, options.platform_key)
    except (KeyboardInterrupt, Terminated) as stop:  # while it waits for node 0: nothing of the job runs here yet
        if channel is not None:  # node 0 does not wait for this node to join
            channel.stop_job(NodeStop(node, signal_of(stop)))
        return 128 + signal_of(stop), None
    except OtherCommand as error:  # node 0 runs a multirun: its job does not wait for this node to join
        assert channel is not None
        stop_waiting_job(channel, NodeStop(node, why=str(error)))
        raise
    if spec.hydra_state is not None:  # log as the job does, on the console only (node 0 writes the job log)
        from ddpw_runtime.procs.rank import configure_logging  # (here: it loads torch, as the store client did)

        _compat.restore_hydra_state(pickle.loads(spec.hydra_state))
        configure_logging(rank=node)
    grace = Grace(options.stop_grace_s, options.interrupt_grace_s)
    job_platform = replace(spec.platform, node_rank=node)
    _writable_here(spec.output_dir, channel, node)
    job = NodeJob(job_platform, Path(spec.output_dir), grace, node, run_id=spec.run_id, restart_on_failure=False)
    state = spec.state_here(dict(os.environ), os.getcwd(), list(sys.path))
    nodes = Nodes(channel, grace)
    try:
        with local_job(spec.task, state, job) as local, local.console() as console:
            ranks = nodes.ranks(local, console)
            with nodes.watching(ranks):  # (it beats until node 0 has this node's end: node 0 waits for no lost node)
                outcomes = supervise(ranks)
                stopped = nodes.seen or channel.stopped()  # (before node 0, once it has the end, closes the store)
                channel.end(NodeEnd(node, outcomes))
    except (KeyboardInterrupt, Terminated) as stop:
        channel.end(NodeEnd(node, interrupted=signal_of(stop)))
        sys.stderr.write(f"[ddpw] {NodeStop(node, signal_of(stop)).text()}; this node's ranks were stopped\n")
        return 128 + signal_of(stop), None
    except Exception as error:
        channel.end(NodeEnd(node, error=portable(error, NodeError)))
        if isinstance(error, JobTimedOut) and not channel.lost:  # node 0 shows where every node's ranks were
            sys.stderr.write(f"[ddpw] {error.head} (on this node, node {node}); node 0 shows where each rank was\n")
            return 1, None
        raise
    if stopped is not None and stopped.node == node:
        stopped = None
    cause = root_cause(outcomes)
    if cause is not None and failed_by_itself(outcomes, before=nodes.seen_at):
        if channel.lost:  # node 0 went away and shows nothing: this node names its rank's failure itself
            made = failure(outcomes)
            assert made is not None
            sys.stderr.write(f"[ddpw] {NodeStop(0, lost=True).text()}, and rank {cause.rank} failed on this node "
                             f"(node {node}): {made.cause} (its log: {made.log_file})\n")
            return 1, stopped
        sys.stderr.write(f"[ddpw] rank {cause.rank} failed on this node (node {node}); node 0 shows the job's error\n")
        return 1, stopped
    if stopped is not None:
        if stopped.signal is not None:  # how each rank ended, in its log (node 0 notes those of a failed job)
            note_failures(outcomes)
        sys.stderr.write(f"[ddpw] {stopped.text()}; this node's ranks were stopped\n")
        return 1, stopped
    if cause is None:
        sys.stderr.write(f"[ddpw] every rank of this node (node {node}) returned; node 0 shows the job's report\n")
        return 0, None
    # its ranks failed only as a peer went away, and this node's stop came first: node 0 shows the root cause
    sys.stderr.write(f"[ddpw] rank {cause.rank} failed on this node (node {node}) only because a peer went away (a "
                     "rank of another node ended, or the network between the nodes failed); node 0 shows the job's "
                     "error\n")
    return 1, None
