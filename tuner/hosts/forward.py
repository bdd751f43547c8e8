"""An SSH local port forward: 127.0.0.1:`port` here -> 127.0.0.1:`remote_port` on an SSH host.

How the tuner reaches a server that listens only on the GPU host's loopback (SGLang's default),
or a host named by an ssh_config alias that only ssh resolves: each connection accepted on the
local port becomes a `direct-tcpip` channel over the host's paramiko transport (`ssh -L`).

Threads: one pump thread runs a selector over the listening socket, every accepted socket and
every channel (paramiko's `Channel.fileno()` is a pipe that turns readable when data or EOF is
buffered), so hundreds of concurrent load-client connections cost no thread each and do not
starve the client's event loop. Opening a channel waits one round trip to the host (and a
reconnect when the transport dropped), so opens run on a few opener threads: a burst of new
connections neither stalls the bytes of open ones nor queues behind one slow open. All threads
are daemons and `close()` joins them. A study runs the forward in a child process
(tuner/hosts/forward_proc.py), so these threads never take the load client's GIL.

The local port stays the same for the forward's life. `host.transport()` reconnects a dropped
transport, so after a drop new connections go over the new one. A transport that went silent
(no reset: a frozen host, a route that loses packets) still looks active; an open that times out
on it asks for a keepalive reply, and one that does not come within `probe_timeout_s` closes it. An open that fails closes the
accepted socket at once and is recorded in `last_error`: kind `tunnel` (the transport is down
and could not be re-established: the host is unreachable) or `refused` (the host answered, but
nothing accepts connections on `remote_port` there: the server is not listening yet).
`breaks` counts transports this forward used that died (each connection over them ended).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import paramiko

log = logging.getLogger(__name__)

#: threads that open channels; each open waits a round trip, so a burst is served in parallel
OPENERS = 4
#: bytes read at once from a socket or channel; SSH packets carry at most 32 KiB anyway
CHUNK = 65536
#: stop reading a side while this much waits to be written to the other (backpressure)
HIGH_WATER = 4 * CHUNK
#: after a failed reconnect, new connections are refused at once for this long (each would
#: otherwise wait out its own reconnect)
DOWN_S = 2.0
#: a channel has no descriptor that says "writable": retry a full send window this often
WINDOW_POLL_S = 0.005
#: the listening socket's backlog: the load client may connect hundreds of times at once
BACKLOG = 1024

#: after an open timed out, how long a transport may take to answer a keepalive before it is
#: taken for dead (a frozen host or a route that loses packets: TCP notices after many minutes)
PROBE_S = 5.0

#: ChannelException codes (RFC 4254 5.1): the host forbids forwarding / could not connect
_PROHIBITED = 1


class TransportSource(Protocol):
    """What the forward needs of a host: a live transport (reconnecting when dropped)."""

    def transport(self) -> paramiko.Transport: ...


@dataclass(frozen=True)
class ForwardError:
    """Why the last channel could not be opened."""

    #: `tunnel`: no transport (host unreachable, reconnect failed, forwarding prohibited);
    #: `refused`: the host could not connect to the remote port (nothing listens there)
    kind: str
    reason: str
    at: float


@dataclass(eq=False)  # identity: pipes live in sets
class _Pipe:
    """One accepted connection and its channel, with the bytes in flight each way."""

    sock: socket.socket
    chan: paramiko.Channel
    up: bytearray = field(default_factory=bytearray)  # from the socket, for the channel
    down: bytearray = field(default_factory=bytearray)  # from the channel, for the socket
    sock_eof: bool = False
    chan_eof: bool = False
    up_shut: bool = False
    down_shut: bool = False
    dead: bool = False
    #: descriptors and the events registered for them (0: not registered)
    sock_fd: int = -1
    chan_fd: int = -1
    sock_mask: int = 0
    chan_mask: int = 0

    @property
    def finished(self) -> bool:
        """Both directions ended (or the channel closed once everything it sent arrived)."""
        return self.down_shut and (self.up_shut or self.chan.closed)


def _answers(tr: paramiko.Transport, timeout_s: float) -> bool:
    """Does `tr` answer a global request (OpenSSH's keepalive) within `timeout_s`? paramiko's
    wait has no deadline, so it runs on a thread that ends when the transport closes."""
    done = threading.Event()

    def ask() -> None:
        with contextlib.suppress(Exception):  # denied or dropped: either way it ends
            tr.global_request("keepalive@openssh.com", wait=True)
        done.set()

    threading.Thread(target=ask, name="tunnel-probe", daemon=True).start()
    return done.wait(timeout_s) and tr.is_active()


def listening_socket() -> socket.socket:
    """A TCP socket listening on 127.0.0.1, on a port the kernel picks."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    return sock


class Forward:
    """Forward 127.0.0.1:`port` (ephemeral, or `listener`'s) to (`remote_host`, `remote_port`)
    on `host`. `lock` serialises `host.transport()` among forwards sharing a host."""

    def __init__(
        self,
        host: TransportSource,
        remote_port: int,
        *,
        remote_host: str = "127.0.0.1",
        open_timeout_s: float = 10.0,
        probe_timeout_s: float = PROBE_S,
        lock: threading.Lock | None = None,
        listener: socket.socket | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.host = host
        self.remote = (remote_host, remote_port)
        self.open_timeout_s = open_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._probing = threading.Lock()  # one keepalive at a time (paramiko keeps one event)
        self._lock = lock or threading.Lock()
        self._clock = clock
        #: why the last open failed (None after a success)
        self.last_error: ForwardError | None = None
        self.opened = 0
        self.breaks = 0
        self._transport: paramiko.Transport | None = None  # the one new channels go over
        self._down_until = float("-inf")  # opens fail fast until then after a failed reconnect
        self._state = threading.Lock()
        self._closing = threading.Event()
        self._accepted: queue.Queue[socket.socket | None] = queue.Queue()
        self._ready: queue.Queue[_Pipe] = queue.Queue()
        self._pipes: set[_Pipe] = set()  # the pump's: connections being forwarded
        self._listener = listener or listening_socket()
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._threads = [threading.Thread(target=self._pump, name="tunnel-pump", daemon=True)]
        self._threads += [
            threading.Thread(target=self._opener, name=f"tunnel-open-{i}", daemon=True)
            for i in range(OPENERS)
        ]
        for t in self._threads:
            t.start()

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the threads and close the listener, every connection and channel."""
        if self._closing.is_set():
            return
        self._closing.set()
        for _ in range(OPENERS):
            self._accepted.put(None)
        self._wake()
        for t in self._threads:
            # an opener may be inside a reconnect: bounded by the host's SSH timeouts
            t.join(timeout=60)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        for q in (self._accepted, self._ready):  # what arrived after the threads ended
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Pipe):
                    _close_pipe(item)
                elif item is not None:
                    _close_socket(item)

    def live(self) -> int:
        """Connections being forwarded now."""
        return len(self._pipes)

    def transport_down(self) -> str | None:
        """Why the last open failed for want of a transport (host unreachable), or None."""
        err = self.last_error
        return err.reason if err is not None and err.kind == "tunnel" else None

    def connects(self, timeout_s: float) -> bool | None:
        """Does something accept connections on the remote port? A channel opened and closed
        at once: True; False: refused there; None: no transport."""
        try:
            chan = self._open(timeout_s)
        except _NoTransport:
            return None
        except paramiko.ChannelException:
            return False
        chan.close()
        return True

    # -- opening channels ---------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is already pending) or closed
            self._wake_w.send(b"x")

    def _current(self) -> paramiko.Transport:
        """The transport for a new channel: the live one or a reconnect, one at a time; after a
        failed reconnect, opens fail fast for DOWN_S instead of each trying again."""
        with self._lock:
            err = self.last_error
            if self._clock() < self._down_until and err is not None:
                raise _NoTransport(err.reason)
            self._note_dead(self._transport)  # died since: count it, whatever the reconnect does
            try:
                tr = self.host.transport()
            except Exception as exc:  # HostUnreachable, HostTrustError, paramiko's own
                self._down_until = self._clock() + DOWN_S
                raise _NoTransport(f"cannot reach the SSH host: {exc}") from exc
            self._down_until = float("-inf")
        with self._state:
            old = self._transport
            if old is not None and old is not tr:
                self.breaks += 1  # died while no channel was open on it
            self._transport = tr
        return tr

    def _note_dead(self, tr: paramiko.Transport | None) -> None:
        """A channel ended on a dead transport: count each transport once."""
        with self._state:
            if tr is not None and tr is self._transport and not tr.is_active():
                self._transport = None
                self.breaks += 1

    def _open(self, timeout_s: float) -> paramiko.Channel:
        """A direct-tcpip channel to the remote port; records why one could not be opened."""
        try:
            tr = self._current()
            try:
                chan = tr.open_channel(
                    "direct-tcpip", self.remote, ("127.0.0.1", 0), timeout=timeout_s
                )
            except paramiko.ChannelException:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._close_if_silent(tr)
                self._note_dead(tr)
                raise _NoTransport(f"the SSH connection failed opening a channel: {exc}") from exc
        except _NoTransport as exc:
            self._failed("tunnel", str(exc))
            raise
        except paramiko.ChannelException as exc:
            if exc.code == _PROHIBITED:
                why = f"the SSH server refuses port forwarding ({exc.text}; AllowTcpForwarding)"
                self._failed("tunnel", why)
                raise _NoTransport(why) from exc
            self._failed("refused", f"nothing accepts connections on {self._where()} ({exc.text})")
            raise
        with self._state:
            self.last_error = None
            self.opened += 1
        return chan

    def _close_if_silent(self, tr: paramiko.Transport) -> None:
        """An open failed on a transport paramiko still calls active (e.g. it timed out): one
        that does not answer a keepalive within `probe_timeout_s` is closed, so the next open
        reconnects instead of waiting out the same silence."""
        with self._probing:
            if tr.is_active() and not _answers(tr, self.probe_timeout_s):
                log.warning(
                    "tunnel to %s: the SSH connection went silent; reconnecting", self._where()
                )
                tr.close()

    def _failed(self, kind: str, reason: str) -> None:
        self.last_error = ForwardError(kind, reason, self._clock())

    def _where(self) -> str:
        return f"{self.remote[0]}:{self.remote[1]} on the SSH host"

    def _opener(self) -> None:
        while True:
            sock = self._accepted.get()
            if sock is None:
                return
            if self._closing.is_set():
                _close_socket(sock)
                return
            try:
                chan = self._open(self.open_timeout_s)
            except (_NoTransport, paramiko.ChannelException) as exc:
                log.debug("tunnel to %s: %s", self._where(), exc)
                _close_socket(sock)  # the client sees its connection end at once
                continue
            chan.settimeout(0.0)
            self._ready.put(_Pipe(sock, chan))
            self._wake()

    # -- the pump -----------------------------------------------------------------------------

    def _pump(self) -> None:
        """Move bytes until closed; each pass touches only the pipes that had events (and
        those waiting for a channel's send window), not every open connection."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        pipes = self._pipes
        blocked: set[_Pipe] = set()  # bytes wait for a channel's send window
        try:
            while not self._closing.is_set():
                touched = set(blocked)
                for key, mask in sel.select(WINDOW_POLL_S if blocked else None):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        pipe, side = key.data
                        if not pipe.dead:
                            self._service(pipe, side, mask)
                        touched.add(pipe)
                while True:
                    try:
                        pipe = self._ready.get_nowait()
                    except queue.Empty:
                        break
                    pipe.sock_fd, pipe.chan_fd = pipe.sock.fileno(), pipe.chan.fileno()
                    pipes.add(pipe)
                    touched.add(pipe)
                blocked.clear()
                for pipe in touched:
                    if not pipe.dead and (pipe.up or (pipe.sock_eof and not pipe.up_shut)):
                        self._flush_up(pipe)  # bytes for the channel, or the client's EOF
                    if pipe.dead or pipe.finished:
                        self._drop(sel, pipe)
                        pipes.discard(pipe)
                        continue
                    _interest(sel, pipe)
                    if pipe.up and not pipe.up_shut:
                        blocked.add(pipe)
        finally:
            for pipe in pipes:
                self._drop(sel, pipe)
            sel.close()

    def _accept(self) -> None:
        for _ in range(64):  # a burst, without starving the other descriptors
            try:
                sock, _ = self._listener.accept()
            except OSError:  # nothing more to accept (BlockingIOError), or closed under us
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._accepted.put(sock)

    def _service(self, p: _Pipe, side: str, mask: int) -> None:
        try:
            if side == "sock":
                if mask & selectors.EVENT_WRITE:
                    _flush_down(p)
                if mask & selectors.EVENT_READ and not p.sock_eof:
                    data = p.sock.recv(CHUNK)
                    if data:
                        p.up += data
                    else:
                        p.sock_eof = True
            else:
                try:
                    data = p.chan.recv(CHUNK)
                except TimeoutError:  # paramiko's socket.timeout: nothing buffered after all
                    return
                if data:
                    p.down += data
                else:
                    p.chan_eof = True
                _flush_down(p)
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, EOFError, paramiko.SSHException):
            p.dead = True  # reset by the client, or the transport failed mid-send

    def _flush_up(self, p: _Pipe) -> None:
        try:
            while p.up and p.chan.send_ready():
                n = p.chan.send(bytes(p.up[:CHUNK]))
                if n <= 0:  # the channel is closed: nobody will read the rest
                    p.dead = True
                    return
                del p.up[:n]
            if not p.up and p.sock_eof and not p.up_shut:
                p.chan.shutdown_write()
                p.up_shut = True
        except TimeoutError:  # the send window closed between send_ready and send
            return
        except (OSError, EOFError, paramiko.SSHException):
            p.dead = True

    def _drop(self, sel: selectors.BaseSelector, p: _Pipe) -> None:
        """Unregister (before closing: a closed descriptor's number is soon reused), note a
        dead transport, close both ends."""
        for fd, mask in ((p.sock_fd, p.sock_mask), (p.chan_fd, p.chan_mask)):
            if mask:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    sel.unregister(fd)
        p.sock_mask = p.chan_mask = 0
        self._note_dead(p.chan.get_transport())
        _close_pipe(p)


def _flush_down(p: _Pipe) -> None:
    try:
        while p.down:
            n = p.sock.send(p.down)
            del p.down[:n]
        if p.chan_eof and not p.down_shut:
            p.sock.shutdown(socket.SHUT_WR)
            p.down_shut = True
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        p.dead = True


def _interest(sel: selectors.BaseSelector, p: _Pipe) -> None:
    """Register what each side waits for: read while the other side keeps up, write when bytes
    wait (a channel's writability is polled instead, see WINDOW_POLL_S)."""
    want_sock = 0
    if not p.sock_eof and len(p.up) < HIGH_WATER:
        want_sock |= selectors.EVENT_READ
    if p.down:
        want_sock |= selectors.EVENT_WRITE
    want_chan = selectors.EVENT_READ if not p.chan_eof and len(p.down) < HIGH_WATER else 0
    if want_sock != p.sock_mask:
        _reregister(sel, p.sock_fd, p.sock_mask, want_sock, (p, "sock"))
        p.sock_mask = want_sock
    if want_chan != p.chan_mask:
        _reregister(sel, p.chan_fd, p.chan_mask, want_chan, (p, "chan"))
        p.chan_mask = want_chan


def _reregister(sel: selectors.BaseSelector, fd: int, have: int, want: int, data: object) -> None:
    if not want:
        sel.unregister(fd)
    elif not have:
        sel.register(fd, want, data)
    else:
        sel.modify(fd, want, data)


class _NoTransport(Exception):
    """No live SSH transport for a new channel."""


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _close_pipe(p: _Pipe) -> None:
    _close_socket(p.sock)
    with contextlib.suppress(Exception):  # paramiko may raise anything from a dead transport
        # Channel.close() closes the pipe behind fileno() while paramiko's transport thread may
        # be feeding a packet that just came (the server still streams): its wake-up write into
        # that pipe failed (EPIPE, EBADF) and ended the transport with every channel on it.
        # set_event takes the buffer's lock: a feed under way ends first, later ones set this.
        for buf in (p.chan.in_buffer, p.chan.in_stderr_buffer):
            buf.set_event(threading.Event())
        p.chan.close()
