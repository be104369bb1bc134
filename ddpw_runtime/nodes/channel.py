"""What the controllers of a job across machines say to each other through the job's TCPStore (torch's, served by
node 0's controller on `master_addr:master_port`, under keys of its own): node 0 publishes the job (`JobSpec`), each
other node joins, any node may stop the job (`NodeStop`, the first counts), and each other node sends how its ranks
ended (`NodeEnd`). Every wait is bounded. Torch is imported only by `StoreSide.connect`."""

from __future__ import annotations

import contextlib
import ipaddress
import pickle
import socket
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from ddpw_conf import Platform
from ddpw_runtime import _compat
from ddpw_runtime.errors import NodeError
from ddpw_runtime.launch import pickling
from ddpw_runtime.launch.process_state import ProcessState
from ddpw_runtime.launch.rank_outcome import RankOutcome
from ddpw_runtime.launch.signals import named

_KEY = "ddpw/nodes/"
SPEC_KEY = _KEY + "spec"
"""Where node 0 publishes its job (`JobSpec`)."""
_STOP_KEY = _KEY + "stop"  # the first node that stops the job says why there (`NodeStop`)
MULTIRUN_KEY = "ddpw/sweep/multirun"
"""Set to the sweep's overrides in the store node 0 serves for a multirun, so a node that runs a plain run says so
at once instead of waiting for a job that never comes."""
POLL_S = 0.05  # how often a wait on a store (the job's, the sweep's) looks again
_CONNECT_SLICE_S = 1.0  # each try to reach node 0 (Ctrl-C is seen between tries)
_CONNECT_PAUSE_S = 0.25  # after a failed try
_ANSWER_S = 5.0  # for node 0's store, once reached, to answer (a program that holds its port never does)
_SAY_WAITING_S = 5.0  # before node 0 says on its console that it waits for the other nodes
_BEAT_S = 0.1  # how often a node other than 0 beats in node 0's store while it takes part
SILENT_S = 5.0
"""How long node 0 hears no beat from another node before it counts that node as lost (at once when the node's
connection to node 0 closes: its program ended)."""
_Side = TypeVar("_Side", bound="StoreSide")


@dataclass
class JobSpec:
    """The job as node 0 decided it, for every other node (`env_set`: what the job set in node 0's environment;
    `job_cwd`: the working dir it entered, else None; `overrides`: as typed on node 0)."""

    platform: Platform
    task: bytes
    hydra_state: bytes | None
    env_set: dict[str, str]
    job_cwd: str | None
    output_dir: str
    run_id: str
    overrides: tuple[str, ...]

    def state_here(self, environ: dict[str, str], cwd: str, sys_path: list[str]) -> ProcessState:
        """This node's ranks' state: its environment with the job's `env_set`, the job's cwd (else `cwd`)."""
        return ProcessState({**environ, **self.env_set}, self.job_cwd or cwd, sys_path, self.hydra_state)


@dataclass(frozen=True)
class NodeStop:
    """Node `node` stopped the job: it got `signal` (Ctrl-C or SIGTERM), or (None) its ranks failed or reached
    their time limit; `lost`: it could no longer be reached; `why`: any other reason, in words."""

    node: int
    signal: int | None = None
    lost: bool = False
    why: str | None = None
    ended: bool = False
    """(With `lost`) its connection to node 0 closed: its program ended, not only its beats."""

    def text(self) -> str:
        """Why the job was stopped, in the words every node prints."""
        if self.why is not None:
            return self.why
        if self.lost:
            how = ("its program ended: its connection to node 0 closed" if self.ended else
                   "it ended, or the network between the nodes failed")
            return f"node {self.node} could no longer be reached ({how})"
        if self.signal is not None:
            return f"node {self.node} got {named(self.signal)}, which ends the job on every node"
        return (f"the job was stopped on node {self.node}, where a rank failed or the time limit passed (node 0 shows "
                "the root cause, which may be a rank of any node)")


@dataclass
class NodeEnd:
    """How the ranks of node `node` (> 0) ended: outcomes, the signal that interrupted it, or its controller's error."""

    node: int
    ranks: list[RankOutcome] = field(default_factory=list)
    interrupted: int | None = None
    error: BaseException | None = None


class OtherCommand(NodeError):
    """Node 0 runs a multirun (-m) and this node a plain run, or the other way round."""


def _on_loopback(host: str) -> str:
    """What a waiting node adds when node 0's address `host` is a loopback one, which no other machine reaches."""
    try:
        loopback = all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return ""
    return (f"; {host} is a loopback address, which only a node on node 0's own machine reaches: give "
            "platform.master_addr node 0's address on the network") if loopback else ""


class StoreSide:
    """Node `node`'s side of a store `store` (a job's or a sweep's) that node 0 serves at `where` (`host:port`). A
    node other than 0 beats there while it takes part; node 0 counts one whose beats stopped as lost."""

    prefix = _KEY
    """Where hydra-ddpw's keys in this store begin."""
    lost = False
    """Node 0's store could no longer be reached (nothing more is sent to it)."""

    def __init__(self, store: Any, node: int, n_nodes: int, where: str) -> None:
        self.store = store
        self.node = node
        self.n_nodes = n_nodes
        self.where = where
        self._beats = False
        self._beating_now = threading.Lock()  # held while a beat is sent (see `stop_beating`)
        self._heard: dict[int, tuple[int, float]] = {}  # node 0: each node's last beat count, when first seen
        self._ended: set[int] = set()  # node 0: the nodes whose connection closed (`hold_connections`)
        self._connection: socket.socket | None = None  # another node's, to node 0, held until this process ends

    def hold_connections(self) -> None:
        """Node 0: accept each other node's connection, held while its program runs (`start_beating` makes it): one
        that closes counts that node as lost at once (its program ended), not after `SILENT_S` without beats (those
        still tell a machine or a network gone, which closes nothing)."""
        host = self._host()
        try:  # (on node 0's address, as its store: the other nodes reach it there)
            listening = socket.create_server((host, 0), family=socket.getaddrinfo(host, 0)[0][0])
        except OSError:  # (then node 0 counts the other nodes by their beats alone)
            return
        self.store.set(f"{self.prefix}connect", str(listening.getsockname()[1]))

        def held(peer: socket.socket) -> None:
            with peer, contextlib.suppress(OSError, ValueError):
                node = int(peer.makefile().readline())
                while peer.recv(64):  # (the node sends nothing more: this returns as its connection closes)
                    pass
                self._ended.add(node)  # closed as its program ended; a reset (OSError) may be the network's

        def accepting() -> None:
            with listening, contextlib.suppress(OSError):
                while True:
                    threading.Thread(target=held, args=(listening.accept()[0],), name="ddpw-node-connection",
                                     daemon=True).start()

        threading.Thread(target=accepting, name="ddpw-node-connections", daemon=True).start()

    def _host(self) -> str:
        """Node 0's address."""
        return self.where.rsplit(":", 1)[0]

    def start_beating(self) -> None:
        """A node other than 0: beat now, then every `_BEAT_S` on a thread until `stop_beating` or node 0 is gone; and
        hold a connection to node 0 until this process ends (`hold_connections`)."""
        self._beat()
        self._beats = True
        threading.Thread(target=self._beating, name="ddpw-node-beat", daemon=True).start()
        with contextlib.suppress(OSError, RuntimeError):  # (node 0 then counts this node by its beats alone)
            if self.store.check([f"{self.prefix}connect"]):  # (set before the job or the sweep, if at all)
                port = int(self.store.get(f"{self.prefix}connect"))
                self._connection = socket.create_connection((self._host(), port), _ANSWER_S)
                # idle for hours otherwise: a firewall that forgot it would reset it
                self._connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                self._connection.sendall(f"{self.node}\n".encode())

    def stop_beating(self) -> None:
        """No more beats; none is in flight once this returns, so none fails on a store node 0 closed after this
        node's last word (torch logs such failures)."""
        with self._beating_now:
            self._beats = False

    def _beating(self) -> None:
        while True:
            time.sleep(_BEAT_S)
            with self._beating_now:
                if not self._beats or self.lost:
                    return
                self._beat()

    def _beat(self) -> None:
        try:
            self.store.add(f"{self.prefix}beat/{self.node}", 1)
        except RuntimeError:  # the store is gone with node 0
            self.lost = True

    def _silent_among(self, nodes: Iterable[int]) -> list[int]:
        """Node 0: those of `nodes` whose beats stopped for `SILENT_S` (counted from when node 0 first looked)."""
        now = time.monotonic()
        beats = {node: self.store.add(f"{self.prefix}beat/{node}", 0) for node in nodes}
        self._heard = {node: (count, self._heard[node][1] if self._heard.get(node, (-1, 0.0))[0] == count else now)
                       for node, count in beats.items()}
        return [node for node, (_, when) in self._heard.items() if now - when > SILENT_S or node in self._ended]

    def lost_stop(self, node: int) -> NodeStop:
        """Node 0: the stop for `node`, lost (`_silent_among` found it)."""
        return NodeStop(node, lost=True, ended=node in self._ended)

    @classmethod
    def connect(cls: type[_Side], platform: Platform, say_waiting: bool = True) -> _Side:
        """Node `platform.node_rank` (> 0) reaches node 0's store, trying for `platform.join_timeout_min`, saying it
        waits when its first try fails (unless not `say_waiting`); `NodeError` naming the address when it cannot."""
        from torch.distributed import TCPStore

        # torch's client prints each call that finds node 0's store gone with a C++ stack: this controller runs no
        # task, and its ranks, forks of its rank starter (made first), keep torch's warnings
        _compat.cpp_warnings_off()
        host, port = platform.master_addr, platform.master_port
        assert host is not None and port is not None and platform.node_rank
        where = f"{host}:{port}"
        deadline, said = time.monotonic() + platform.join_timeout_min * 60.0, False
        while True:  # a plain socket first: torch's own client would log every failed try, and holds Ctrl-C
            try:
                socket.create_connection((host, port), _CONNECT_SLICE_S).close()
                break
            except OSError as exc:
                if not said and say_waiting:
                    sys.stderr.write(f"[ddpw] node {platform.node_rank} is waiting for node 0 at {where} (up to "
                                     f"platform.join_timeout_min={platform.join_timeout_min:g}){_on_loopback(host)}\n")
                    said = True
                if time.monotonic() >= deadline:
                    raise NodeError(
                        f"node {platform.node_rank} could not reach node 0 at {where} within platform.join_timeout_min="
                        f"{platform.join_timeout_min:g} ({exc}); start the same command on node 0, and check that this "
                        "machine reaches it at that address (platform.master_addr) and port (platform.master_port)"
                    ) from None
                time.sleep(_CONNECT_PAUSE_S)
        made: list[Any] = []

        def store_client() -> None:  # on a thread: torch's client waits past its timeout for a peer that never answers
            try:
                made.append(TCPStore(host, port, is_master=False, wait_for_workers=False,
                                     timeout=timedelta(seconds=_ANSWER_S)))
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread, which says what it means
                made.append(exc)

        # torch's client logs its failure to reach what does not answer as node 0's store as a C++ error with a stack:
        # the NodeError below says it in one line
        _compat.cpp_warnings_off(errors_too=True)
        client = threading.Thread(target=store_client, name="ddpw-node-0-store", daemon=True)
        client.start()
        # torch's own timeout, then as long again for it to give up: it takes a little past it, and a thread still in
        # its client as the program ends aborts it (SIGABRT) when the client then fails
        client.join(2 * _ANSWER_S)
        if not made or isinstance(made[0], Exception):
            why = f" ({str(made[0]).splitlines()[0]})" if made else ""
            raise NodeError(f"node {platform.node_rank} reached {where}, but what listens there did not answer as node "
                            f"0's store within {_ANSWER_S:g} s{why}: another program holds that port on node 0 "
                            "(choose a free platform.master_port), or platform.master_addr is not node 0's address")
        _compat.cpp_warnings_off()  # (node 0's store answered: torch's C++ errors show again)
        made[0].set_timeout(timedelta(minutes=platform.join_timeout_min))
        return cls(made[0], platform.node_rank, platform.n_nodes, where)

    def claim(self, key: str, what: str) -> None:
        """Count this node at `key` (it `what`, "joined node 0's job"); NodeError when another process did first."""
        if self.store.add(key, 1) > 1:
            raise NodeError(f"node {self.node} already {what} at {self.where}: another process runs as node "
                            f"{self.node}; give every machine its own platform.node_rank (or its platform's variables)")

    def check_placed(self, n_nodes: int, what: str = "job") -> None:
        """NodeError unless this node is one of the `n_nodes` of node 0's `what` (this node's platform may say
        another count)."""
        if self.node >= n_nodes:
            raise NodeError(f"node {self.node} is not a node of node 0's {what} at {self.where}, which runs on "
                            f"{n_nodes} node(s) (platform.n_nodes={n_nodes} on node 0, {self.n_nodes} here): give "
                            "every machine the same platform.n_nodes and its own platform.node_rank from 0 to "
                            f"{n_nodes - 1} (or its platform's variables)")

    def stop_job(self, stop: NodeStop) -> None:
        """Stop the job of this store on every node, unless another node stopped it first."""
        self.store.compare_set(_STOP_KEY, "", pickling.dumps(stop))  # set only where not set yet


class NodeChannel(StoreSide):
    """Node `node`'s side of the job's store."""

    ended = False
    """This node sent its end (nothing more is sent for it)."""

    def publish(self, spec: JobSpec) -> None:
        """Node 0: the job, for the other nodes."""
        self.hold_connections()
        self.store.set(SPEC_KEY, pickling.dumps(spec))

    def spec(self, timeout_min: float) -> JobSpec:
        """The job node 0 published, waited for at most `timeout_min`; NodeError past it."""
        deadline = time.monotonic() + timeout_min * 60.0
        while not self.store.check([SPEC_KEY]):
            if self.store.check([MULTIRUN_KEY]):
                raise OtherCommand(f"node 0 (at {self.where}) runs a multirun (-m) and node {self.node} a plain run: "
                                   "run the same command on every node")
            if time.monotonic() >= deadline:
                raise NodeError(f"node {self.node} reached node 0 at {self.where}, which did not start the job "
                                f"within platform.join_timeout_min={timeout_min:g}")
            time.sleep(POLL_S)
        return pickle.loads(self.store.get(SPEC_KEY))

    def join(self) -> None:
        """This node has the job and starts its ranks, beating until it sent its end (node 0 counts a node that
        joined and fell silent as lost); NodeError when another process joined as this node already."""
        self._beat()  # (before it counts as joined: node 0 then sees a beat it had not seen)
        self.claim(f"{_KEY}joined/{self.node}", "joined node 0's job")
        self.start_beating()

    def missing(self, timeout_min: float) -> list[int]:
        """Node 0: the nodes not joined after at most `timeout_min`, or as soon as a node stopped the job or one that
        joined fell `silent` (then stopped as lost); past `_SAY_WAITING_S`, the console says which it waits for."""
        start = time.monotonic()
        said = False
        while True:
            missing = [node for node in range(1, self.n_nodes) if not self.store.check([f"{_KEY}joined/{node}"])]
            if missing and (gone := [node for node in self.silent() if node not in missing]):
                self.stop_job(self.lost_stop(gone[0]))
                return missing
            waited = time.monotonic() - start
            if missing and not said and waited >= _SAY_WAITING_S:
                sys.stderr.write(f"[ddpw] node 0 is waiting at {self.where} for node(s) {', '.join(map(str, missing))} "
                                 f"to join (up to platform.join_timeout_min={timeout_min:g})"
                                 f"{_on_loopback(self.where.rsplit(':', 1)[0])}\n")
                said = True
            if not missing or waited >= timeout_min * 60.0 or self.store.check([_STOP_KEY]):
                return missing
            time.sleep(POLL_S)

    def stopped(self) -> NodeStop | None:
        """Who stopped the job, once one has (a node that lost node 0 finds `lost`)."""
        if not self.lost:
            try:
                return pickle.loads(self.store.get(_STOP_KEY)) if self.store.check([_STOP_KEY]) else None
            except RuntimeError:  # the store is gone with node 0
                self.lost = True
        return NodeStop(0, lost=True)

    def silent(self) -> list[int]:
        """Node 0: the other nodes that have not sent their end and whose beats stopped."""
        return self._silent_among(node for node in range(1, self.n_nodes)
                                  if not self.store.check([f"{_KEY}end/{node}"]))

    def end(self, end: NodeEnd) -> None:
        """A node's end, for node 0, once (nothing when node 0 is gone: then `lost`)."""
        if not self.lost and not self.ended:
            self.ended = True
            self.stop_beating()
            try:
                self.store.set(f"{_KEY}end/{end.node}", pickling.dumps(end))
            except RuntimeError:  # the store is gone with node 0
                self.lost = True

    def ends(self, timeout_s: float) -> tuple[dict[int, NodeEnd], list[int]]:
        """Node 0: the other nodes' ends that came within `timeout_s`, and the nodes that fell `silent` meanwhile."""
        deadline = time.monotonic() + timeout_s
        keys = {node: f"{_KEY}end/{node}" for node in range(1, self.n_nodes)}
        lost: list[int] = []
        while time.monotonic() < deadline:
            lost = self.silent()
            if self.store.check([key for node, key in keys.items() if node not in lost]):
                break
            time.sleep(POLL_S)
        return {node: pickle.loads(self.store.get(key)) for node, key in keys.items() if self.store.check([key])}, lost
