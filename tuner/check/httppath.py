"""The HTTP path from the tuner to the server's port, tried before the night.

A short-lived listener (`python -m http.server`, bound where the server will bind: its `host`
flag, SGLang's default 127.0.0.1) is started detached on the host on the study's port, serving
an empty temp directory with one file holding a nonce; it is fetched through the endpoint the
study will use (`server.target.endpoint_for`: directly, or an SSH tunnel), so the answer is known to be
ours. The listener is stopped by its process group and its directory removed afterwards.
"""

from __future__ import annotations

import secrets
import shlex
import time
import urllib.error
import urllib.request

from tuner.check.lines import CheckLine, fail, ok
from tuner.check.probe import Probe
from tuner.check.sglang import python_module
from tuner.errors import HostUnreachable, InfraError
from tuner.hosts.base import group_pids_script, port_listen_script, quote_argv
from tuner.server.endpoint import Endpoint
from tuner.server.target import endpoint_for
from tuner.sglang.flags import normalize_flags

#: how often the host polls the listener's port while it starts, and its group while it stops
POLL_S = 0.1
_TMP_PREFIX = "/tmp/tuner-check."


def http_path(p: Probe) -> CheckLine:
    """GET a nonce from a listener on the study's port, through the study's endpoint."""
    host = p.host
    assert host is not None
    port = p.cfg.target.port
    nonce = secrets.token_hex(8)
    # start_detached creates the log's directory (0700): a fresh, unguessable one holds the
    # log and the nonce file the listener serves, and nothing else
    tmp = f"{_TMP_PREFIX}{nonce}"
    log = f"{tmp}/listener.log"
    pgid = None
    endpoint = endpoint_for(p.cfg.target, host)  # type: ignore[arg-type]
    try:
        found = python_module(p.launch.template)
        python = found[0] if found else ["python3"]
        bind = str(normalize_flags(p.cfg.server).get("host", "127.0.0.1"))
        argv = [*python, "-m", "http.server", "--bind", bind, "--directory", tmp, str(port)]
        path_env = {"PATH": p.launch.env["PATH"]} if "PATH" in p.launch.env else None
        command = f"printf %s {nonce} > {nonce}.txt && exec {quote_argv(argv)}"
        pgid = host.start_detached(command, log_path=log, cwd=tmp, env=path_env)
        if not p.run(_wait_listening(pgid, port, p.deadlines.http_s)).ok:
            tail = " | ".join(host.read_tail(log, 3)) or "no output"
            return fail(
                "http path",
                f"a test listener ({' '.join(argv[:3])}) did not listen on {port} on "
                f"{p.where} within {p.deadlines.http_s:g} s: {tail[:200]}",
                InfraError,
            )
        return _fetch(p, endpoint, port, nonce)
    finally:
        try:
            stop = _stop_script(pgid, p.deadlines.http_s) if pgid is not None else ""
            p.run(f"{stop}rm -rf -- {shlex.quote(tmp)}")
        finally:
            endpoint.close()


def _wait_listening(pgid: int, port: int, deadline_s: float) -> str:
    """Exit 0 once `port` listens; 1 when the group is gone or the deadline passed."""
    polls = max(1, int(deadline_s / POLL_S))
    return (
        f"i=0; while [ $i -lt {polls} ]; do "
        f'[ "$({port_listen_script(port)})" != 0 ] && exit 0; '
        f'[ -n "$({group_pids_script(pgid)})" ] || exit 1; '
        f"sleep {POLL_S}; i=$((i+1)); done; exit 1"
    )


def _stop_script(pgid: int, deadline_s: float) -> str:
    """TERM the listener's group, wait for it to go, KILL what lingers (a `; `-ended prefix)."""
    polls = max(1, int(deadline_s / POLL_S))
    return (
        f"kill -TERM -- -{int(pgid)} 2>/dev/null; i=0; "
        f'while [ -n "$({group_pids_script(pgid)})" ] && [ $i -lt {polls} ]; do '
        f"sleep {POLL_S}; i=$((i+1)); done; "
        f'[ -n "$({group_pids_script(pgid)})" ] && kill -KILL -- -{int(pgid)} 2>/dev/null; '
    )


def _fetch(p: Probe, endpoint: Endpoint, port: int, nonce: str) -> CheckLine:
    way = endpoint.describe(port)
    why = endpoint.unreachable()
    if why is not None:
        return fail("http path", f"{why}", HostUnreachable)
    start = time.monotonic()
    try:
        with urllib.request.urlopen(
            f"{endpoint.url(port)}/{nonce}.txt", timeout=p.deadlines.http_s
        ) as resp:
            body = resp.read(64).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        why = endpoint.unreachable()
        return fail(
            "http path",
            f"a listener on port {port} on {p.where} is not reached via {way}: "
            f"{why or getattr(exc, 'reason', exc)}; check target.http_host, the server's "
            "--host and any firewall",
            HostUnreachable,
        )
    if body.strip() != nonce:
        return fail(
            "http path",
            f"port {port} via {way} answered, but not from the test listener on {p.where}: "
            "another server answers there (target.http_host?)",
            InfraError,
        )
    ms = (time.monotonic() - start) * 1000
    return ok("http path", f"GET via {way} reached a listener on {port} ({ms:.0f} ms)")
