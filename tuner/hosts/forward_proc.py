"""The SSH port forward (tuner/hosts/forward.py) in a child process, the way a study runs it.

Why a process: in the tuner's process, paramiko's transport thread and the forward's pump need
the GIL for every packet, and took it from the load client's event loop: at 256 streams the
client's loop lag tripled and its throughput fell (tests/bench/bench_tunnel.py). In a child
they run beside the client, not in turns with it.

The parent owns the listening socket (127.0.0.1, ephemeral port) and hands it to the child, so
the port stays the same for the forward's life, even when a child that died is started again.
The child makes its own SSH connection (`SSHHost` from the same `SSHOptions`: keys,
known_hosts, ProxyJump, deadlines; nothing secret crosses the pipe, a password stays in the
environment variable the options name) and answers one JSON line per request on stdin:
`{"op": "status"}` -> last error, breaks, channels opened, connections live;
`{"op": "connects", "timeout_s": t}` -> {"connects": true|false|null}.
It ends when its stdin closes: when the tuner closes it, and when the tuner dies (no orphan).
It ignores SIGINT, so a Ctrl-C reaches the tuner alone, which then closes it.

    python -m tuner.hosts.forward_proc      (started by ForwardProcess, never by hand)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuner.hosts.forward import PROBE_S, Forward, ForwardError, listening_socket
from tuner.hosts.ssh import SSHHost, SSHOptions

log = logging.getLogger(__name__)

#: the child's start-up (interpreter, imports) and one answer, at most
START_S = 30.0
ANSWER_S = PROBE_S + 5.0  # an open that timed out then waits for a keepalive


class ForwardProcess:
    """A `Forward` to (`remote_host`, `remote_port`) over its own SSH connection, in a child."""

    def __init__(
        self,
        options: SSHOptions,
        remote_port: int,
        *,
        remote_host: str = "127.0.0.1",
        open_timeout_s: float = 10.0,
    ):
        self.options = options
        self.remote = (remote_host, remote_port)
        self.open_timeout_s = open_timeout_s
        self._listener = listening_socket()
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._breaks_before = 0  # breaks counted by children that ended
        self._last: dict[str, Any] = {}
        self._failed: str | None = None  # why the child could not be (re)started
        self._closed = False
        with self._lock:
            self._start()

    def __enter__(self) -> ForwardProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what callers ask ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The child's counters and last error (`{}` when it cannot answer)."""
        out = self._ask({"op": "status"}, ANSWER_S)
        if "breaks" in out:
            out["breaks"] += self._breaks_before
            self._last = out
        return out

    @property
    def breaks(self) -> int:
        return int(self.status().get("breaks", self._last.get("breaks", self._breaks_before)))

    @property
    def opened(self) -> int:
        return int(self.status().get("opened", 0))

    def live(self) -> int:
        return int(self.status().get("live", 0))

    @property
    def last_error(self) -> ForwardError | None:
        err = self.status().get("last_error")
        return ForwardError(err["kind"], err["reason"], err["at"]) if err else None

    def transport_down(self) -> str | None:
        """Why the tunnel cannot carry a connection now (no transport, or no child), or None."""
        out = self.status()
        if "error" in out:
            return out["error"]
        err = out.get("last_error")
        return err["reason"] if err and err["kind"] == "tunnel" else None

    def connects(self, timeout_s: float) -> bool | None:
        out = self._ask({"op": "connects", "timeout_s": timeout_s}, timeout_s + ANSWER_S)
        return out.get("connects")

    def close(self) -> None:
        """End the child (its stdin closes: it closes every connection) and the listener."""
        with self._lock:
            self._closed = True
            self._stop()
            self._listener.close()

    # -- the child ----------------------------------------------------------------------------

    def _ask(self, request: dict[str, Any], limit_s: float) -> dict[str, Any]:
        """One request, one answer; a child that died is started again (same listener)."""
        with self._lock:
            if self._closed:
                return {"error": "the tunnel is closed"}
            if self._proc is None or self._proc.poll() is not None:
                self._restart()
            if self._proc is None:
                return {"error": self._failed or "the tunnel process is not running"}
            try:
                self._send(request)
                return self._read(time.monotonic() + limit_s)
            except (OSError, ValueError, TimeoutError) as exc:
                why = f"the tunnel process did not answer: {exc}"
                log.warning("%s; it is started again on the next request", why)
                self._lost()
                return {"error": why}

    def _start(self) -> None:
        env = dict(os.environ)
        # the child imports this package as the parent did, installed or from a checkout
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        fd = self._listener.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.hosts.forward_proc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
            env=env,
        )
        self._proc, self._buf = proc, b""
        config = {
            "options": asdict(self.options),
            "fd": fd,
            "remote": list(self.remote),
            "open_timeout_s": self.open_timeout_s,
        }
        try:
            self._send(config)
            ready = self._read(time.monotonic() + START_S)
        except (OSError, ValueError, TimeoutError) as exc:
            ready = {"error": f"the tunnel process did not start: {exc}"}
        if "error" in ready:
            self._failed = str(ready["error"])
            self._stop()
        else:
            self._failed = None

    def _restart(self) -> None:
        if self._proc is not None:
            log.warning(
                "the SSH tunnel process ended (exit %s); starting it again", self._proc.poll()
            )
            self._lost()
        self._start()

    def _lost(self) -> None:
        """The child is gone or stopped: every connection it carried broke."""
        self._breaks_before = int(self._last.get("breaks", self._breaks_before)) + 1
        self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the child closes its connections and exits
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()

    def _send(self, obj: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(obj).encode() + b"\n")
        self._proc.stdin.flush()

    def _read(self, deadline: float) -> dict[str, Any]:
        """One JSON line from the child by `deadline` (raw reads: no buffer hides a line)."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise ConnectionError("the tunnel process exited")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)


# -- the child's side ------------------------------------------------------------------------


def _status(fwd: Forward) -> dict[str, Any]:
    err = fwd.last_error
    return {
        "last_error": {"kind": err.kind, "reason": err.reason, "at": err.at} if err else None,
        "breaks": fwd.breaks,
        "opened": fwd.opened,
        "live": fwd.live(),
    }


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    """The child: read the config, forward until stdin closes, answer requests meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner handles Ctrl-C and closes us
    line = sys.stdin.readline()
    if not line:
        return 0
    cfg = json.loads(line)
    listener = socket.socket(fileno=cfg["fd"])
    try:
        host = SSHHost(SSHOptions(**cfg["options"]))
    except Exception as exc:  # the parent built the same options; report, do not trace
        _answer({"error": f"cannot set up the SSH tunnel: {exc}"})
        return 1
    remote_host, remote_port = cfg["remote"]
    fwd = Forward(
        host,
        int(remote_port),
        remote_host=remote_host,
        open_timeout_s=float(cfg["open_timeout_s"]),
        listener=listener,
    )
    try:
        _answer({"ready": True})
        for line in sys.stdin:  # ends when the tuner closes our stdin, or dies
            req = json.loads(line)
            if req.get("op") == "connects":
                _answer({"connects": fwd.connects(float(req["timeout_s"]))})
            else:
                _answer(_status(fwd))
    finally:
        fwd.close()
        host.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the tuner went away first
        sys.exit(0)
