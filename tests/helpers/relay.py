"""A loopback TCP relay that breaks connections on command, for SSH fault tests.

    from tests.helpers.relay import Relay

    with Relay(sshd.port) as relay:          # 127.0.0.1:relay.port -> 127.0.0.1:sshd.port
        host = SSHHost(sshd.options(port=relay.port, known_hosts=...))
        relay.cut()                          # close every current connection now
        relay.refuse(2.0)                    # close new connections on accept for 2 s
        relay.refuse(None); relay.accept()   # ... until accept() is called
        relay.chaos(5.0, seed=1)             # cut a random live connection ~5 times a second
        relay.chaos(0)                       # stop the chaos
        relay.cut_after_bytes(1240)          # cut new connections once the client sent > 1240 B
        relay.stall()                        # current connections drop every byte, never close
        relay.first_bytes                    # the last connection's first client bytes (<= 8 KiB)
        relay.stats                          # accepted, refused, cut counts

Threads, not asyncio: one acceptor, two pumps per connection, one chaos thread. A cut shuts
both sockets down (which wakes a pump blocked in recv) and closes them, so the client sees its
connection end (EOF or reset) at once; nothing here ever waits without a deadline. Loopback only.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from dataclasses import dataclass

#: how many of a connection's first client bytes are kept (first_bytes)
HEAD_BYTES = 8192

#: how often blocking calls wake up to notice close() (seconds)
POLL_S = 0.1
#: a pump reads at most this much at a time
CHUNK = 65536


@dataclass
class RelayStats:
    """What the relay did so far."""

    accepted: int = 0
    refused: int = 0
    cut: int = 0


class _Conn:
    """One relayed connection: the client's socket and ours to the target."""

    def __init__(self, client: socket.socket, upstream: socket.socket, cut_after: int | None):
        self.client = client
        self.upstream = upstream
        self.cut_after = cut_after
        self.sent_up = 0
        self.head = bytearray()  # the client's first bytes, whatever the TCP segmentation
        self._closed = threading.Lock()
        self.closed = False
        self.stalled = False  # bytes read are dropped: a link that loses packets, no RST

    def close(self) -> bool:
        """Shut both sockets down and close them; True the first time."""
        with self._closed:
            if self.closed:
                return False
            self.closed = True
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        return True


class Relay:
    """Forward 127.0.0.1:`port` to 127.0.0.1:`target_port`; break connections on command."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.stats = RelayStats()
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._refuse_until: float | None = None  # monotonic deadline; inf = until accept()
        self._cut_after: int | None = None
        #: sizes of the first client->target reads of the latest connection (protocol probing)
        self._first: _Conn | None = None
        self._stop = threading.Event()
        self._chaos_stop: threading.Event | None = None
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(POLL_S)
        self.port: int = self._listener.getsockname()[1]

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Relay:
        self._spawn(self._accept_loop, "relay-accept")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, stop the chaos, cut every connection, join the threads."""
        self._stop.set()
        self.chaos(0)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()
        for t in self._threads:
            t.join(timeout=5)

    def _spawn(self, target, name: str, *args: object) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    # -- commands -------------------------------------------------------------------------

    @property
    def first_bytes(self) -> bytes:
        """The first bytes the last accepted connection's client sent (b'' before any)."""
        with self._lock:
            return bytes(self._first.head) if self._first else b""

    def live(self) -> int:
        """How many connections are being relayed now."""
        with self._lock:
            return len(self._conns)

    def cut(self) -> int:
        """Close every current connection now; how many were cut."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        n = sum(1 for c in conns if c.close())
        with self._lock:
            self.stats.cut += n
        return n

    def stall(self) -> int:
        """From now on drop every byte of the current connections without closing them (a host
        that froze, a route that loses packets: TCP notices after many minutes, if ever); new
        connections are relayed as before. How many were stalled."""
        with self._lock:
            for c in self._conns:
                c.stalled = True
            return len(self._conns)

    def refuse(self, seconds: float | None = None) -> None:
        """Close new connections as soon as they are accepted: for `seconds`, or until accept()."""
        if seconds is not None and seconds < 0:
            raise ValueError("seconds must be >= 0")
        until = float("inf") if seconds is None else time.monotonic() + seconds
        with self._lock:
            self._refuse_until = until

    def accept(self) -> None:
        """Relay new connections again."""
        with self._lock:
            self._refuse_until = None

    def cut_after_bytes(self, n: int | None) -> None:
        """Cut each new connection once its client sent more than `n` bytes (None: never).

        The read that crosses `n` is not forwarded: e.g. n = the size of SSH's clear-text
        handshake cuts every connection between key exchange and authentication."""
        self._cut_after = n

    def chaos(self, rate_per_s: float, seed: int = 0) -> None:
        """Cut one random live connection at Poisson times of rate `rate_per_s` (0 stops)."""
        if self._chaos_stop is not None:
            self._chaos_stop.set()
            self._chaos_stop = None
        if rate_per_s > 0:
            stop = threading.Event()
            self._chaos_stop = stop
            self._spawn(self._chaos_loop, "relay-chaos", rate_per_s, random.Random(seed), stop)

    # -- threads ----------------------------------------------------------------------------

    def _refusing(self) -> bool:
        with self._lock:
            until = self._refuse_until
            if until is not None and time.monotonic() >= until:
                self._refuse_until = until = None
            return until is not None

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if self._refusing():
                with self._lock:
                    self.stats.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # target down: the client sees its connection end
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, upstream, self._cut_after)
            with self._lock:
                self._conns.add(conn)
                self.stats.accepted += 1
                self._first = conn
            self._spawn(self._pump, "relay-up", conn, client, upstream)
            self._spawn(self._pump, "relay-down", conn, upstream, client)

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                if conn.stalled:
                    continue  # read (TCP acks it) and lost: the sender never hears of it
                if src is conn.client:
                    if len(conn.head) < HEAD_BYTES:
                        conn.head += data[: HEAD_BYTES - len(conn.head)]
                    conn.sent_up += len(data)
                    if conn.cut_after is not None and conn.sent_up > conn.cut_after:
                        with self._lock:
                            self.stats.cut += 1
                        break
                dst.sendall(data)
        except OSError:
            pass
        # one side ended (or was cut): end the whole connection, as a dropped link would
        with self._lock:
            self._conns.discard(conn)
        conn.close()

    def _chaos_loop(self, rate: float, rng: random.Random, stop: threading.Event) -> None:
        while not stop.wait(rng.expovariate(rate)):
            with self._lock:
                conns = list(self._conns)
                victim = rng.choice(conns) if conns else None
                if victim is not None:
                    self._conns.discard(victim)
            if victim is not None and victim.close():
                with self._lock:
                    self.stats.cut += 1
