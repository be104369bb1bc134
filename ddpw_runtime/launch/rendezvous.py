"""The rendezvous socket: bound by the controller before any rank starts, handed to rank 0. So the port is known and
held (no other program can take it meanwhile), a busy or forbidden fixed port is refused before anything starts, and the
store listens only where it must: loopback for one node, the first node's address for several (torch's own TCPStore
server would listen on every interface)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

from ddpw_conf import ConfigError, Platform
from ddpw_runtime.launch.plan import LOOPBACK


def listen(platform: Platform, master_addr: str | None, master_port: int | None) -> socket.socket:
    """A listening socket for the job's TCPStore (by default on loopback and a free port)."""
    addr = platform.master_addr or master_addr or LOOPBACK
    port = platform.master_port or master_port or 0
    info = resolved(addr, port)
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    # As torch's store does: a port whose last job's connections linger in TIME_WAIT (a requeued SLURM job's) can be
    # bound again; a port someone listens on still cannot.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(info[4])
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        across = platform.n_nodes > 1  # (there, null is what the platform says, else 29500 on every node)
        free = ("; give every node the same one (a node 0 of this job that already runs there holds it too: give every "
                "other node its own platform.node_rank)" if across else
                " or leave master_port unset (null) to get a free one per job")
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError("platform.master_port", port, "another program is listening on this port; choose a free "
                              f"port{free}") from exc
        if exc.errno == errno.EACCES:
            first = unprivileged_ports()
            raise ConfigError("platform.master_port", port, f"this program may not listen on this port (ports below "
                              f"{first} need root or CAP_NET_BIND_SERVICE); choose a port of {first} or above"
                              f"{free}") from exc
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError("platform.master_addr", addr, "this machine has no such address; use one of its own "
                              "addresses" + (", the one the other nodes reach it at" if across else
                                             ", or leave master_addr unset (null)")) from exc
        raise
    return sock


def resolved(addr: str, port: int = 0) -> tuple[Any, ...]:
    """The first stream address `addr` and `port` resolve to (`socket.getaddrinfo`'s entry); else `ConfigError`."""
    try:
        return socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError("platform.master_addr", addr, f"cannot resolve it ({exc}); use an IP address or a host "
                          "name this machine resolves") from exc


def unprivileged_ports() -> int:
    """The first port any program may listen on (Linux's `ip_unprivileged_port_start`; 1024 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024
