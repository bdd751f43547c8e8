"""`tuner check` of a server across nodes (`target.nodes`): what every node must have.

The other checks probe nodes[0] (the target's host). These lines cover the rest:
- `nodes`: every node is reached over SSH and runs a command (each with its own SSH settings);
- `node sglang`: the launch's SGLang version on every node, all the same (one line naming the
  nodes that differ: ranks of different versions do not rendezvous, or worse, do);
- `node gpus`: each node has tp / nnodes GPUs (nvidia-smi; a node without it: a warning);
- `dist init`: a short listener on nodes[0]'s `target.dist_init_port` (stopped by its process
  group) is reached from every other node at the address the ranks are given
  (`--dist-init-addr`), with bash's /dev/tcp; the port must be free on nodes[0] first.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from tuner.check import sglang
from tuner.check.httppath import _stop_script, _wait_listening
from tuner.check.lines import CheckLine, fail, ok, warn
from tuner.check.machine import _NO_SMI, CSV, GPU_QUERY, parse_gpus
from tuner.check.probe import Probe, said
from tuner.check.spacefacts import largest_parallel
from tuner.errors import ConfigError, HostUnreachable, InfraError, SetupError, TunerError
from tuner.hosts.base import quote_argv
from tuner.server.nodes import nodes_server

#: what `nodes` adds to a study's checks (planned only with target.nodes)
KEYS = frozenset({"nodes", "node sglang", "node gpus", "dist init"})


@contextmanager
def _node_probes(p: Probe) -> Iterator[list[tuple[str, Probe]]]:
    """(name, probe) of every node, rank order, each with its own SSH host; closed after."""
    servers = nodes_server(p.cfg.target)
    names = [s.host.name.removeprefix("ssh ") for s in servers.servers]
    probes = [
        (name, Probe(p.cfg, p.launch, p.deadlines, host=s.host, runs_dir=p.runs_dir))
        for name, s in zip(names, servers.servers, strict=True)
    ]
    try:
        yield probes
    finally:
        for s in servers.servers:
            s.host.close()


def _reach(probe: Probe) -> str | None:
    """Why the node cannot run a command, or None."""
    try:
        res = probe.run("echo tuner-node-ok")
    except (HostUnreachable, InfraError, TunerError) as exc:
        return str(exc)
    return None if res.ok and "tuner-node-ok" in res.stdout else said(res)


def reachable(p: Probe) -> CheckLine:
    """Every node logs in and runs a command."""
    with _node_probes(p) as probes:
        bad = [f"{name} ({why})" for name, probe in probes if (why := _reach(probe))]
    if bad:
        return fail(
            "nodes",
            f"not reached: {'; '.join(bad)}; fix that node's entry in target.nodes "
            "(its host, or its ssh: port, user, identity_file, known_hosts)",
            HostUnreachable,
        )
    return ok("nodes", f"{len(p.cfg.target.nodes or ())} nodes reached over SSH")


def versions(p: Probe) -> CheckLine:
    """The launch's SGLang version on every node; all the same."""
    found: dict[str, str] = {}
    with _node_probes(p) as probes:
        for name, probe in probes:
            line = sglang.version(probe)
            if line.failed:
                return fail("node sglang", f"{name}: {line.detail}", line.error or SetupError)
            found[name] = probe.facts.get("sglang_version", "unknown")
    return same_version(found)


def same_version(found: dict[str, str]) -> CheckLine:
    """One line over every node's version (node name -> version): the nodes that differ from
    the most common one (nodes[0]'s on a tie) are named."""
    values = list(found.values())
    common = max(values, key=lambda v: (values.count(v), v == values[0]))
    odd = [f"{name} has {v}" for name, v in found.items() if v != common]
    if odd:
        return fail(
            "node sglang",
            f"the nodes run different SGLang versions: {', '.join(odd)}, the others "
            f"{common}; install the same on every node (the ranks of one server must match)",
            SetupError,
        )
    return ok("node sglang", f"{common} on every node")


def gpus(p: Probe) -> CheckLine:
    """Each node has its share of the GPUs: tp / nnodes (tp is the total over the nodes)."""
    nodes = len(p.cfg.target.nodes or ())
    tp = largest_parallel(p.cfg).tp
    need = max(tp // max(nodes, 1), 1)
    short: list[str] = []
    counted: list[str] = []
    with _node_probes(p) as probes:
        for name, probe in probes:
            res = probe.run_env(
                f"command -v nvidia-smi || exit {_NO_SMI}; nvidia-smi {GPU_QUERY} {CSV}"
            )
            if res.exit_code == _NO_SMI and not res.stdout.strip():
                return warn("node gpus", f"no nvidia-smi on {name}: GPUs not checked")
            have = len(parse_gpus(res.stdout)) if res.ok else 0
            counted.append(f"{name} has {have}")
            if have < need:
                short.append(f"{name} has {have}")
    if short:
        return fail(
            "node gpus",
            f"tp {tp} over {nodes} nodes needs {need} GPUs on each; {', '.join(short)}",
            ConfigError,
        )
    return ok("node gpus", f"{need} needed per node; {', '.join(counted)}")


def dist_port(p: Probe) -> CheckLine:
    """A listener on nodes[0]'s dist-init port, reached from every other node."""
    servers = nodes_server(p.cfg.target)
    address, _, port_text = servers.dist_init_addr.rpartition(":")
    port = int(port_text)
    first = servers.rank0.host
    pgid = None
    tmp = f"/tmp/tuner-check.{secrets.token_hex(8)}"  # start_detached creates it (0700)
    log = f"{tmp}/listener.log"
    try:
        if not first.port_free(port):
            holders = ", ".join(f"pid {pid} {cmd[:40]}" for pid, cmd in first.port_holders(port))
            return fail(
                "dist init",
                f"port {port} is held on nodes[0] ({holders or 'by another user'}): stop it or "
                "set target.dist_init_port",
                SetupError,
            )
        code = (
            "import socket, sys; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('', {port})); s.listen(16); s.settimeout(60)\n"
            "while True:\n c, _ = s.accept(); c.close()"
        )
        found = sglang.python_module(p.launch.template)
        python = found[0] if found else ["python3"]
        argv = [*python, "-c", code]
        path_env = {"PATH": p.launch.env["PATH"]} if "PATH" in p.launch.env else None
        pgid = first.start_detached(f"exec {quote_argv(argv)}", log_path=log, env=path_env)
        if not first.run_shell(_wait_listening(pgid, port, p.deadlines.http_s)).ok:
            tail = " | ".join(first.read_tail(log, 3)) or "no output"
            return fail("dist init", f"a test listener did not start on {port}: {tail}", InfraError)
        bad = []
        for rank, server in enumerate(servers.servers[1:], 1):
            probe = f"timeout {p.deadlines.http_s:g} bash -c 'exec 3<>/dev/tcp/{address}/{port}'"
            res = server.host.run_shell(probe, timeout=p.deadlines.http_s + 5)
            if not res.ok:
                bad.append(f"nodes[{rank}] ({said(res)})")
        if bad:
            return fail(
                "dist init",
                f"{address}:{port} on nodes[0] is not reached from {', '.join(bad)}: open the "
                "port between the nodes (a firewall), or name nodes[0] by an address they reach",
                SetupError,
            )
        return ok("dist init", f"{address}:{port} reached from every node")
    finally:
        if pgid is not None:
            first.run_shell(
                _stop_script(pgid, p.deadlines.http_s)
                + f"rm -rf -- {shlex.quote(log.rsplit('/', 1)[0])}"
            )
        for server in servers.servers:
            server.host.close()
