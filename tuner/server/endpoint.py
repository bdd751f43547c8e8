"""Where the tuner reaches the server's HTTP port: directly, or through an SSH tunnel.

`DirectEndpoint(host)`: http://host:PORT (a local server, or `target.http_host`).
`TunnelEndpoint(ssh_host)`: http://127.0.0.1:LOCAL, a port forward to 127.0.0.1:PORT on the SSH
host (tuner/hosts/forward.py), so a server that listens only on the GPU host's loopback, or a
host only ssh_config can name, is reached. The forward runs in a child process with its own SSH
connection (tuner/hosts/forward_proc.py): the forwarded bytes neither take the load client's GIL
nor share a transport (and its reconnects) with the tuner's commands.

Whose failure it is: a way to the port that is down (the tunnel cannot reconnect, the direct
host's name does not resolve) is the world's, never the configuration's. `ReachWatch` applies
that while a server starts: HostUnreachable at once when the endpoint is down, InfraError when
the host says the port listens but nothing connects through the endpoint for REACH_GRACE_S.
`breaks()` counts broken tunnels, so a load run cut by one is the world's too (api.py).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from typing import Protocol

from tuner.errors import HostUnreachable, InfraError
from tuner.hosts.forward_proc import ForwardProcess
from tuner.hosts.ssh import SSHHost

#: how long the host may say the server's port listens while nothing connects to it through
#: the endpoint before the start is the world's failure (a wrong http_host, a firewall, a
#: server bound to another interface). Not a Timeouts field: it is not a wait a user tunes,
#: only how soon a broken way to the port is named instead of waiting out ready_s
REACH_GRACE_S = 15.0


class Endpoint(Protocol):
    """The way from the tuner to the server's port."""

    def url(self, port: int) -> str:
        """Base URL of the server listening on `port` on the host."""
        ...

    def describe(self, port: int) -> str:
        """The way to `port`, for messages."""
        ...

    def unreachable(self) -> str | None:
        """Why the way is down now (tunnel cannot reconnect, name does not resolve), or None."""
        ...

    def connects(self, port: int, timeout_s: float) -> bool | None:
        """Does a TCP connection to `port` open through this way? None: the way is down."""
        ...

    def breaks(self) -> int:
        """How many times the way broke so far (connections over it were cut)."""
        ...

    def close(self) -> None: ...


def url_for(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class DirectEndpoint:
    """The server's port at `host` itself (a name, an IPv4 or an IPv6 address)."""

    def __init__(self, host: str):
        self.host = host

    def url(self, port: int) -> str:
        return url_for(self.host, port)

    def describe(self, port: int) -> str:
        return self.url(port)

    def unreachable(self) -> str | None:
        if _is_address(self.host):
            return None
        try:
            socket.getaddrinfo(self.host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            return f"cannot resolve {self.host} (target.http_host?): {exc}"
        return None

    def connects(self, port: int, timeout_s: float) -> bool | None:
        if self.unreachable() is not None:
            return None
        try:
            with socket.create_connection((self.host, port), timeout=timeout_s):
                return True
        except OSError:  # refused, timed out (a firewall dropping), no route
            return False

    def breaks(self) -> int:
        return 0

    def close(self) -> None:
        pass


class TunnelEndpoint:
    """The server's port on 127.0.0.1 of an SSH host, through one local forward per port.

    Each forward runs in a child process with its own SSH connection (`ssh_host`'s options:
    the same host, keys, known_hosts, ProxyJump, deadlines), started on first use.
    """

    def __init__(self, ssh_host: SSHHost, *, remote_host: str = "127.0.0.1"):
        self.ssh_host = ssh_host
        self.remote_host = remote_host
        self._forwards: dict[int, ForwardProcess] = {}

    def __enter__(self) -> TunnelEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def forward(self, port: int) -> ForwardProcess:
        """The forward to `port` (started on first use; its local port never changes)."""
        fwd = self._forwards.get(port)
        if fwd is None:
            opts = self.ssh_host.options
            fwd = ForwardProcess(
                opts, port, remote_host=self.remote_host, open_timeout_s=opts.channel_timeout_s
            )
            self._forwards[port] = fwd
        return fwd

    def url(self, port: int) -> str:
        return url_for("127.0.0.1", self.forward(port).port)

    def describe(self, port: int) -> str:
        return (
            f"an SSH tunnel to {self.remote_host}:{port} on {self.ssh_host.name} ({self.url(port)})"
        )

    def unreachable(self) -> str | None:
        for port, fwd in self._forwards.items():
            why = fwd.transport_down()
            if why is not None:
                return f"the SSH tunnel to port {port} on {self.ssh_host.name} is down: {why}"
        return None

    def connects(self, port: int, timeout_s: float) -> bool | None:
        return self.forward(port).connects(timeout_s)

    def breaks(self) -> int:
        return sum(f.breaks for f in self._forwards.values())

    def close(self) -> None:
        """Stop the forwards (their processes close their SSH connections)."""
        forwards, self._forwards = list(self._forwards.values()), {}
        for fwd in forwards:
            fwd.close()


class PortHost(Protocol):
    """What the watch asks of the host: its name, and whether something listens on a port."""

    name: str

    def port_free(self, port: int) -> bool: ...


class ReachWatch:
    """While a server starts: tells a server the tuner cannot reach from one not up yet.

    `check(status)` after each /health poll (`status` None: no HTTP answer at all). Raises
    HostUnreachable when the endpoint is down; InfraError when the host said the port listens
    for `grace_s` while no TCP connection to it opened through the endpoint. A port that
    accepts connections but does not answer HTTP (a slow or hung server) is left to the
    caller's ready deadline. The host is asked at most every grace_s / 3.

    `remote`: the server runs on another machine than `host` (a Slurm step, a pod): whether
    the port listens on `host` says nothing of it (another process of the tuner's machine may
    hold that number), so only the endpoint's own verdict (`unreachable`) counts.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        host: PortHost,
        port: int,
        grace_s: float = REACH_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        connect_timeout_s: float = 5.0,
        remote: bool = False,
    ):
        self.endpoint, self.host, self.port, self.remote = endpoint, host, port, remote
        self.grace_s, self.connect_timeout_s, self._clock = grace_s, connect_timeout_s, clock
        self._since: float | None = None  # listening and not connectable since then
        # the first question waits a third of the grace: a start that dies at once (most
        # configuration failures) costs no extra host command, which over SSH is ~0.5-2 s
        self._next = clock() + grace_s / 3

    def check(self, status: int | None) -> None:
        if status is not None:  # an HTTP answer (503 while starting): the way works
            self._since = None
            return
        self._down()
        now = self._clock()
        if self.remote or now < self._next:
            return
        self._next = now + self.grace_s / 3
        if self.host.port_free(self.port):  # not listening yet: nothing to reach
            self._since = None
            return
        ok = self.endpoint.connects(self.port, self.connect_timeout_s)
        if ok is None:
            self._down()
        if ok:
            self._since = None
            return
        if self._since is None:
            self._since = now
        elif now - self._since >= self.grace_s:
            raise InfraError(
                f"server listens on {self.port} on {self.host.name} but the tuner cannot "
                f"reach it via {self.endpoint.describe(self.port)} for {now - self._since:.0f} s;"
                " check target.http_host / firewall"
            )

    def _down(self) -> None:
        why = self.endpoint.unreachable()
        if why is not None:
            raise HostUnreachable(f"{why} (server port {self.port} on {self.host.name})")
