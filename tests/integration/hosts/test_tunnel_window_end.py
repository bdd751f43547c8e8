"""The end of a load window through the SSH forward (tuner/hosts/forward.py): every client
connection closes while the server still streams to it. That must end those connections only,
never the SSH transport under them nor the listener, and never count as a broken tunnel.

It used to break about 3% of load runs: paramiko's `Channel.close()` closes the channel's
event pipe (the descriptor the pump selects on) while the transport thread may be writing its
"data arrived" byte into it for the very packet that just came, and that write failed
(EPIPE/EBADF) inside the transport thread, which then ended with every channel on it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers.sshd import Sshd
from tuner.hosts import SSHHost
from tuner.hosts.forward import Forward

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

#: load windows to run, connections in each (all closed at once, mid-stream)
WINDOWS = 60
STREAMS = 16
#: the whole test's budget for the windows (a busy machine runs fewer, not longer)
BUDGET_S = 15.0
#: bytes a client reads before it closes: the stream is well under way
READ_BEFORE_CLOSE = 8192
#: each write of the streaming server: small, so many SSH packets (and pipe wake-ups) arrive
PIECE = b"d" * 512
#: no single step may take longer
STEP_S = 20.0


class _Streamer:
    """A TCP server on 127.0.0.1 that, once a connection sends a line, writes to it without
    end until the peer goes away (a server streaming tokens to a client that left)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="window-end-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._stream, args=(conn,), daemon=True).start()

    def _stream(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(STEP_S)
            conn.recv(64)
            while not self._stop.is_set():
                conn.sendall(PIECE)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(STEP_S)


@pytest.fixture
def streamer() -> Iterator[_Streamer]:
    server = _Streamer()
    try:
        yield server
    finally:
        server.close()


def _window(port: int, streams: int, reset: bool) -> None:
    """One load window: `streams` connections start streaming, then all close mid-stream
    (`reset`: with a RST, as a killed client; else an orderly close with bytes unread)."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=STEP_S) for _ in range(streams)]
    try:
        for c in conns:
            c.sendall(b"go\n")
        for c in conns:
            got = 0
            while got < READ_BEFORE_CLOSE:
                chunk = c.recv(65536)
                assert chunk, "the forward ended a stream the server had not ended"
                got += len(chunk)
    finally:
        for c in conns:
            if reset:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()


def test_closing_mid_stream_never_breaks_the_tunnel(sshd_server: Sshd, streamer: _Streamer) -> None:
    host = SSHHost(sshd_server.options())
    try:
        with Forward(host, streamer.port) as fwd:
            end = time.monotonic() + BUDGET_S
            done = 0
            while done < WINDOWS and time.monotonic() < end:
                _window(fwd.port, STREAMS, reset=done % 2 == 1)
                done += 1
                if fwd.breaks or fwd.last_error is not None:
                    break
            print(f"\n{done} windows of {STREAMS} streams: breaks {fwd.breaks}, "
                  f"last error {fwd.last_error}, channels {fwd.opened}")  # fmt: skip
            assert fwd.breaks == 0 and fwd.last_error is None, (done, fwd.last_error)
            assert done >= 5, "too few windows ran to mean anything"
            # the listener and the transport still carry a new connection
            _window(fwd.port, 1, reset=False)
            assert fwd.breaks == 0 and fwd.last_error is None
    finally:
        host.close()
