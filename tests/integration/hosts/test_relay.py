"""The SSH-cutting relay (tests/helpers/relay.py) between SSHHost and the real test sshd.

What the tuner relies on: a command through a broken link reconnects or raises HostUnreachable,
within its deadlines, and never hangs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.relay import Relay
from tests.helpers.sshd import Sshd
from tuner.errors import CommandTimeout, HostUnreachable
from tuner.hosts import SSHHost

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

#: no command in these tests may take longer than this, whatever the relay does
BOUND_S = 30.0


def _banner(port: int) -> bytes:
    """What a raw client reads first from 127.0.0.1:port (b'' when the connection is closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(5)
        try:
            return s.recv(64)
        except ConnectionResetError:
            return b""


@pytest.fixture
def relay(sshd_server: Sshd) -> Iterator[Relay]:
    with Relay(sshd_server.port) as r:
        yield r


@pytest.fixture
def host(sshd_server: Sshd, relay: Relay, tmp_path: Path) -> Iterator[SSHHost]:
    """SSHHost through the relay: the sshd's host key, known under the relay's port."""
    opts = sshd_server.relayed(relay.port, tmp_path)
    h = SSHHost(opts)
    try:
        yield h
    finally:
        h.close()


def _timed(fn, *args, **kwargs):
    """(result or the exception raised, seconds taken)."""
    t0 = time.monotonic()
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:
        out = exc
    return out, time.monotonic() - t0


def test_commands_pass_through(host: SSHHost, relay: Relay) -> None:
    res = host.run_shell("echo through-the-relay", timeout=10)
    assert res.ok and res.stdout == "through-the-relay\n"
    assert relay.stats.accepted == 1 and relay.live() == 1


def test_cut_then_next_command_reconnects(host: SSHHost, relay: Relay) -> None:
    assert host.run_shell("true").ok
    assert relay.cut() == 1
    out, took = _timed(host.run_shell, "echo again", timeout=10)
    print(f"after cut: {type(out).__name__} in {took:.2f} s")
    assert not isinstance(out, Exception), out  # the relay accepts again: a reconnect works
    assert out.stdout == "again\n"
    assert relay.stats.accepted == 2 and took < BOUND_S


def test_cut_during_a_command_never_hangs(host: SSHHost, relay: Relay) -> None:
    assert host.run_shell("true").ok
    threading.Timer(0.5, relay.cut).start()
    out, took = _timed(host.run_shell, "sleep 2; echo finished", timeout=10)
    print(f"cut mid-command: {type(out).__name__} in {took:.2f} s")
    assert relay.stats.cut >= 1
    # run_shell retries once after a drop: the command's second run finishes, or it gives up
    assert isinstance(out, HostUnreachable) or out.stdout == "finished\n", out
    assert took < BOUND_S


def test_a_silent_link_reconnects_for_the_next_command(host: SSHHost, relay: Relay) -> None:
    """A link that loses every byte without a reset (a frozen host, a lost route): the command
    running then ends at its deadline; the next cannot open a channel in time, so it reconnects
    and runs."""
    assert host.run_shell("true").ok
    threading.Timer(0.5, relay.stall).start()
    out, took = _timed(host.run_shell, "sleep 2; echo finished", timeout=4)
    print(f"stalled mid-command: {type(out).__name__} in {took:.2f} s")
    assert isinstance(out, CommandTimeout), out
    assert took < BOUND_S and relay.stats.accepted == 1
    out, took = _timed(host.run_shell, "echo again", timeout=10)
    print(f"next command: {type(out).__name__} in {took:.2f} s")
    assert not isinstance(out, Exception), out
    assert out.stdout == "again\n" and relay.stats.accepted == 2 and took < BOUND_S


def test_refused_until_accept_raises_host_unreachable(host: SSHHost, relay: Relay) -> None:
    relay.refuse(None)
    assert _banner(relay.port) == b""  # closed on accept
    out, took = _timed(host.run_shell, "true")
    print(f"refused: {type(out).__name__} in {took:.2f} s")
    assert isinstance(out, HostUnreachable), out
    assert relay.stats.refused >= 2 and took < BOUND_S
    relay.accept()
    assert host.run_shell("echo back").stdout == "back\n"


def test_refuse_for_a_while(relay: Relay) -> None:
    assert _banner(relay.port).startswith(b"SSH-2.0")
    relay.refuse(3.0)
    until = time.monotonic() + 3.0  # no earlier than the relay's own deadline
    assert _banner(relay.port) == b""  # refused within the 3 s, even on a busy machine
    time.sleep(max(0.0, until + 0.2 - time.monotonic()))
    assert _banner(relay.port).startswith(b"SSH-2.0")


def _clear_text_bytes(stream: bytes) -> int:
    """Bytes of an SSH client's stream up to and including NEWKEYS (RFC 4253 section 6).

    Parsed from the bytes, not from recv() sizes: TCP may split or join packets on a busy host.
    Before NEWKEYS every packet is clear text: uint32 length, padding length, message type...
    """
    end = stream.index(b"\r\n") + 2  # the identification line
    while True:
        length = int.from_bytes(stream[end : end + 4], "big")
        msg_type = stream[end + 5]
        end += 4 + length
        assert end <= len(stream), "NEWKEYS not within the first bytes kept"
        if msg_type == 21:  # SSH_MSG_NEWKEYS: the last clear-text packet
            return end


def _handshake_bytes(host: SSHHost, relay: Relay) -> int:
    """Bytes the client sends before authentication: banner, KEXINIT, ECDH init, NEWKEYS."""
    host.close()
    assert host.run_shell("true").ok
    stream = relay.first_bytes
    assert stream.startswith(b"SSH-2.0-"), stream[:32]
    return _clear_text_bytes(stream)


def test_clear_text_bytes_parses_packets_not_reads() -> None:
    def packet(msg_type: int, body: bytes = b"") -> bytes:
        payload = bytes([msg_type]) + body
        pad = 8 - (5 + len(payload)) % 8 + 8
        return (1 + len(payload) + pad).to_bytes(4, "big") + bytes([pad]) + payload + bytes(pad)

    head = b"SSH-2.0-x\r\n" + packet(20, b"k" * 900) + packet(30, b"e" * 36) + packet(21)
    assert _clear_text_bytes(head + b"encrypted...") == len(head)


def test_cut_during_authentication_is_unreachable(host: SSHHost, relay: Relay) -> None:
    relay.cut_after_bytes(_handshake_bytes(host, relay))
    host.close()
    out, took = _timed(host.run_shell, "true")
    print(f"cut during auth: {out!r} in {took:.2f} s")
    assert took < BOUND_S
    assert isinstance(out, HostUnreachable), out


def test_cut_after_bytes_cuts_between_kex_and_auth(host: SSHHost, relay: Relay) -> None:
    relay.cut_after_bytes(_handshake_bytes(host, relay))
    host.close()
    out, took = _timed(host.run_shell, "true")
    assert isinstance(out, HostUnreachable), out
    assert took < BOUND_S
    relay.cut_after_bytes(None)
    assert host.run_shell("echo fine").stdout == "fine\n"


def test_chaos_cuts_at_random_and_commands_stay_bounded(host: SSHHost, relay: Relay) -> None:
    relay.chaos(1.5, seed=7)
    outcomes: list[str] = []
    t_end = time.monotonic() + 4.0
    worst = 0.0
    while time.monotonic() < t_end:
        out, took = _timed(host.run_shell, "sleep 0.2; echo ok", timeout=5)
        worst = max(worst, took)
        if isinstance(out, Exception):
            assert isinstance(out, HostUnreachable), out
            outcomes.append("unreachable")
        else:
            assert out.stdout == "ok\n"
            outcomes.append("ok")
    relay.chaos(0)
    print(
        f"chaos: {len(outcomes)} commands, {outcomes.count('ok')} ok, "
        f"{outcomes.count('unreachable')} unreachable, {relay.stats.cut} cuts, "
        f"worst {worst:.2f} s"
    )
    assert relay.stats.cut >= 1  # ~6 expected in 4 s
    assert "ok" in outcomes  # between cuts, commands get through
    assert worst < BOUND_S
    assert host.run_shell("echo calm").stdout == "calm\n"
