"""A multirun across machines without SLURM (docs/multi-node.md): node 0's Hydra process serves a TCPStore of the
sweep's own on `master_addr:master_port` while it runs, publishing there each job's store port and then that the sweep
ended (early, as its process ends after a failed job, a callback's error or a stop). Every other node runs the same
`-m` command and follows job after job until node 0 says the sweep ended (an error when it ended early or its store
went away). A node interrupted between jobs says so here, so node 0 starts no more jobs. Every wait is bounded."""

from __future__ import annotations

import atexit
import contextlib
import json
import pickle
import time
from datetime import timedelta

from ddpw_conf import Platform
from ddpw_runtime.errors import NodeError
from ddpw_runtime.launch.signals import named
from ddpw_runtime.nodes.channel import MULTIRUN_KEY, POLL_S, SPEC_KEY, NodeStop, StoreSide

_KEY = "ddpw/sweep/"
_ENDED = -1  # published in place of a job's port once the sweep ended
_ENDED_EARLY = -2  # the same, when node 0's process ends before its sweep ended (Hydra raised)
_ACK_WAIT_S = 10.0  # how long node 0, as it ends, waits for the nodes that follow its sweep to read that it ended


class SweepChannel(StoreSide):
    """Node `node`'s side of the sweep's store (`connect`: a node other than 0 reaches it)."""

    prefix = _KEY

    @staticmethod
    def host(platform: Platform, overrides: tuple[str, ...]) -> SweepChannel:
        """Node 0: serve the sweep's store on `platform.master_addr:master_port`, saying the sweep's `overrides`."""
        from torch.distributed import TCPStore

        assert platform.master_addr is not None and platform.master_port is not None
        store = TCPStore(platform.master_addr, platform.master_port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(minutes=platform.join_timeout_min))
        store.set(_KEY + "n_nodes", str(platform.n_nodes))
        store.set(MULTIRUN_KEY, json.dumps(overrides))
        channel = SweepChannel(store, 0, platform.n_nodes, f"{platform.master_addr}:{platform.master_port}")
        channel.hold_connections()
        return channel

    def overrides(self) -> tuple[str, ...]:
        """A node other than 0: the sweep's overrides as typed on node 0."""
        return tuple(json.loads(self.store.get(MULTIRUN_KEY)))

    def publish_job(self, idx: int, port: int) -> None:
        """Node 0: the sweep's `idx`-th job across the nodes is published in its own store at `port`."""
        self.store.set(f"{_KEY}job/{idx}", str(port))

    def publish_end(self, early: bool = False) -> None:
        """Node 0: the sweep ended (`early`: before its end); wait (at most `_ACK_WAIT_S`) until no node follows it."""
        self.store.set(f"{_KEY}job/{self.store.add(_KEY + 'jobs', 0)}", str(_ENDED_EARLY if early else _ENDED))
        deadline = time.monotonic() + _ACK_WAIT_S
        while self.store.add(_KEY + "left", 0) < self.n_nodes - 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def follow(self) -> None:
        """A node other than 0 follows the sweep from now on, beating until it leaves; NodeError when node 0's sweep has
        no such node, or another process follows it as this node (then it never counts as following, nor leaves)."""
        if self.store.check([_KEY + "n_nodes"]):  # (not where node 0 runs a plain run: `next_port` says so)
            self.check_placed(int(self.store.get(_KEY + "n_nodes")), "sweep")
        self._beat()  # (before it counts as following: node 0 then sees a beat it had not seen)
        self.claim(f"{_KEY}following/{self.node}", "follows node 0's sweep")
        self.start_beating()  # (not before: a refused process's connection, closing, would count this node lost)

    def leave(self, node: int | None = None) -> None:
        """Node `node` (this one when None) no longer follows the sweep: said by it, or by node 0 for one a job lost;
        nothing when node 0's store is gone."""
        if node is None:
            self.stop_beating()
        with contextlib.suppress(RuntimeError):
            self.store.set(f"{_KEY}left/{self.node if node is None else node}", "1")
            self.store.add(_KEY + "left", 1)

    def silent(self) -> list[int]:
        """Node 0: the nodes that follow the sweep, have not left it, and whose beats stopped."""
        return self._silent_among(node for node in range(1, self.n_nodes)
                                  if self.store.check([f"{_KEY}following/{node}"])
                                  and not self.store.check([f"{_KEY}left/{node}"]))

    def started(self) -> int:
        """Node 0: count one more job across the nodes; its index in the sweep (0 for the first)."""
        return int(self.store.add(_KEY + "jobs", 1)) - 1

    def next_port(self, idx: int, timeout_min: float) -> int | None:
        """A node other than 0: the port of the sweep's `idx`-th job, None when the sweep ended; NodeError past
        `timeout_min`, when the sweep ended early, or when node 0's store went away."""
        key = f"{_KEY}job/{idx}"
        deadline = time.monotonic() + timeout_min * 60.0
        while not self._has(key):
            if self._has(SPEC_KEY):  # the store of node 0's job, which waits for this node: it ends at once too
                why = (f"node 0 (at {self.where}) runs a plain run and node {self.node} a multirun (-m): run the same "
                       "command on every node")
                with contextlib.suppress(RuntimeError):
                    self.stop_job(NodeStop(self.node, why=why))
                raise NodeError(why)
            if time.monotonic() >= deadline:
                raise NodeError(f"node 0 (at {self.where}) started no job #{idx} within "
                                f"platform.join_timeout_min={timeout_min:g} and did not end its sweep")
            time.sleep(POLL_S)
        port = int(self.store.get(key))
        if port == _ENDED_EARLY:
            raise NodeError("node 0's sweep ended with an error: a job failed or a callback raised there, or it was "
                            "stopped (node 0's console shows which)")
        return None if port == _ENDED else port

    def _has(self, key: str) -> bool:
        """Whether node 0's sweep store holds `key`; NodeError once that store is gone."""
        try:
            return bool(self.store.check([key]))
        except RuntimeError:
            raise NodeError(f"node 0's sweep ended without saying so (its store at {self.where} went away: it failed, "
                            "was stopped or was killed; node 0's console shows which)") from None

    def stop(self, sig: int) -> None:
        """A node other than 0 got `sig` (Ctrl-C, SIGTERM): node 0 starts no more jobs (nothing when it is gone)."""
        with contextlib.suppress(RuntimeError):
            self.store.compare_set(_KEY + "stop", "", pickle.dumps((self.node, sig)))

    def stopped(self) -> str | None:
        """Node 0: why another node stopped the sweep, once one has."""
        if not self.store.check([_KEY + "stop"]):
            return None
        node, sig = pickle.loads(self.store.get(_KEY + "stop"))
        return f"node {node} got {named(sig)}, which ends the sweep on every node"


def stop_waiting_job(side: StoreSide, stop: NodeStop) -> None:
    """A node that reached node 0's sweep store (`side`) but runs a plain run: stop the sweep's latest job (waited for
    at most `_ACK_WAIT_S`), which waits for it to join, and count it as following no more (nothing when node 0 or its
    job is gone)."""
    deadline = time.monotonic() + _ACK_WAIT_S
    with contextlib.suppress(RuntimeError, ValueError):
        side.store.add(_KEY + "left", 1)
        while time.monotonic() < deadline:
            jobs = int(side.store.add(_KEY + "jobs", 0))
            if jobs and side.store.check([key := f"{_KEY}job/{jobs - 1}"]):
                port = int(side.store.get(key))
                if port > 0:
                    stop_job_at(side, port, stop)
                return
            time.sleep(POLL_S)


def stop_job_at(side: StoreSide, port: int, stop: NodeStop) -> None:
    """Stop the sweep's job whose store is at `port` on `side`'s host, unless a node stopped it first (nothing when
    that store is gone or not reached within `_ACK_WAIT_S`)."""
    from torch.distributed import TCPStore

    host = side.where.rsplit(":", 1)[0]
    with contextlib.suppress(RuntimeError, ValueError):
        job = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=_ACK_WAIT_S))
        StoreSide(job, side.node, side.n_nodes, f"{host}:{port}").stop_job(stop)


_hosted: SweepChannel | None = None


def hosted(platform: Platform, overrides: tuple[str, ...]) -> SweepChannel:
    """Node 0's sweep store, served from its first job across machines on for as long as this process runs."""
    global _hosted
    if _hosted is None:
        _hosted = SweepChannel.host(platform, overrides)
        # Hydra ends a sweep that raised (a failed job, say) without `on_multirun_end`: the end is said as it exits.
        atexit.register(end_hosted, early=True)
    return _hosted


def serves_sweep(platform: Platform) -> bool:
    """Whether this process serves its multirun's store on `platform`'s `master_addr:master_port`."""
    return _hosted is not None and _hosted.where == f"{platform.master_addr}:{platform.master_port}"


def end_hosted(early: bool = False) -> None:
    """Node 0's sweep ended (`early`: before its end): say so to the other nodes, once (nothing without one)."""
    global _hosted
    if _hosted is not None:
        _hosted.publish_end(early)
        _hosted = None
