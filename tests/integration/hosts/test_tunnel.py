"""Reaching the server through an SSH tunnel (issue 11): the real sshd, the real simulator.

- a forward (tuner/hosts/forward.py) carries many concurrent HTTP streams to a simulator that
  listens on 127.0.0.1 only, tells "nothing listens there" from "the tunnel is down", and comes
  back on the same local port after the SSH connection is cut;
- a study whose `target.host` is an ssh_config alias nothing but ssh resolves runs through the
  tunnel (the default), and a cut of its SSH connections mid-load is the world's failure;
- the lifecycle raises at once when the tunnel is down, and after a short grace when the host
  says the port listens but nothing connects through the endpoint (a wrong http_host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.relay import Relay
from tests.helpers.simproc import sim_server
from tests.helpers.sshd import Sshd, assert_group_gone
from tests.helpers.studies import REPO, TUNER, study_file, tuner
from tuner.config.target import Timeouts
from tuner.errors import HostUnreachable, InfraError
from tuner.hosts import LocalHost, SSHHost
from tuner.hosts.forward import Forward
from tuner.outcome import Attr, Status
from tuner.server.endpoint import DirectEndpoint, TunnelEndpoint
from tuner.server.launch import LaunchSpec
from tuner.server.lifecycle import Server

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

#: no step here may take longer, whatever the relay does
BOUND_S = 30.0
#: a configuration's load run scored (its SLO verdict either way)
MEASURED = (Status.OK, Status.SLO_MISSED)
ALIAS = "gpu-node-1"


def _get(url: str, timeout: float = BOUND_S) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return None, b""


def _tunnel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tunnel-")]


def _tunnel_children() -> list[int]:
    me = psutil.Process()
    return [p.pid for p in me.children() if "tuner.hosts.forward_proc" in " ".join(p.cmdline())]


def _no_tunnel_left(deadline_s: float = 10.0) -> None:
    """No forward thread in this process, no forward process under it."""
    end = time.monotonic() + deadline_s
    while (_tunnel_threads() or _tunnel_children()) and time.monotonic() < end:
        time.sleep(0.05)
    assert _tunnel_threads() == [] and _tunnel_children() == []


@pytest.fixture
def ssh(sshd_server: Sshd) -> Iterator[SSHHost]:
    host = SSHHost(sshd_server.options())
    try:
        yield host
    finally:
        host.close()


def test_a_forward_carries_concurrent_streams(ssh: SSHHost) -> None:
    from tuner.config.workload import WorkloadSection
    from tuner.loadgen.options import load_options
    from tuner.loadgen.run import run_load_sync
    from tuner.loadgen.workload import requests_for

    with sim_server("--sim-profile", "llama-3.1-8b-h100") as sim, Forward(ssh, sim.port) as fwd:
        url = f"http://127.0.0.1:{fwd.port}"
        status, body = _get(url + "/get_server_info")
        assert status == 200 and json.loads(body)["port"] == sim.port
        w = WorkloadSection(
            num_requests=192,
            duration_s=None,
            input_len=64,
            output_len=24,
            warmup_requests=4,
            flush_cache=False,
            seed=3,
        )
        res = run_load_sync(url, requests_for(w, num_requests=192), load_options(w, concurrency=96))
        m = res.metrics()
        print(f"\nthrough the forward: {m.completed} ok, {m.errors} errors, {fwd.opened} channels")
        assert m.completed == 192 and m.errors == 0
        assert fwd.opened >= 96  # one channel per client connection, concurrently
        assert fwd.last_error is None and fwd.breaks == 0
        # the server's close reaches the client (HTTP/1.0: the response ends at EOF)
        with socket.create_connection(("127.0.0.1", fwd.port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            got = b"".join(iter(lambda: s.recv(4096), b""))
        assert got.startswith(b"HTTP/1.") and b" 200 " in got.split(b"\r\n")[0]
        # the client's close reaches the server: every connection ended, none leaks
        end = time.monotonic() + 10
        while fwd.live() and time.monotonic() < end:
            time.sleep(0.05)
        assert fwd.live() == 0
    _no_tunnel_left()


def test_nothing_listening_is_not_a_tunnel_down(ssh: SSHHost) -> None:
    with Forward(ssh, free_port()) as fwd:
        t0 = time.monotonic()
        # the first open also connects to sshd: seconds on a busy machine, never the 60 s
        assert _get(f"http://127.0.0.1:{fwd.port}/health", timeout=60)[0] is None
        assert time.monotonic() - t0 < BOUND_S  # closed at once, not left to the client's timeout
        assert fwd.last_error is not None and fwd.last_error.kind == "refused"
        assert fwd.transport_down() is None and fwd.connects(20.0) is False


def test_a_cut_tunnel_comes_back_on_the_same_port(sshd_server: Sshd, tmp_path: Path) -> None:
    with (
        sim_server() as sim,
        Relay(sshd_server.port) as relay,
        TunnelEndpoint(SSHHost(sshd_server.relayed(relay.port, tmp_path))) as ep,
    ):
        url = ep.url(sim.port)
        assert _tunnel_children()  # the forward runs in its own process
        assert _get(url + "/health")[0] == 200 and ep.breaks() == 0
        relay.refuse(None)
        assert relay.cut() == 1  # the tunnel's own connection
        t0 = time.monotonic()
        assert _get(url + "/health")[0] is None
        assert time.monotonic() - t0 < BOUND_S
        why = ep.unreachable()
        assert why is not None and "tunnel" in why
        assert ep.connects(sim.port, 5.0) is None
        relay.accept()
        time.sleep(2.1)  # opens fail fast for a moment after a failed reconnect (DOWN_S)
        assert ep.url(sim.port) == url  # the local port stays
        assert _get(url + "/health")[0] == 200  # re-established after the reconnect
        # the cut transport counted once, by now: paramiko may mark it dead only after the
        # first open on it failed (a busy machine shows that), and the next open counts it
        assert ep.unreachable() is None and ep.breaks() == 1 and relay.stats.accepted == 2
    _no_tunnel_left()


def test_a_silent_transport_is_replaced(sshd_server: Sshd, tmp_path: Path) -> None:
    """A link that loses every packet without a reset (a frozen host, a dropped route): TCP
    would not notice for many minutes. An open that times out asks the transport for a reply;
    none within the probe's time closes it, and the next connection goes over a new one."""
    with sim_server() as sim, Relay(sshd_server.port) as relay:
        host = SSHHost(sshd_server.relayed(relay.port, tmp_path))
        fwd = Forward(host, sim.port, open_timeout_s=2.0, probe_timeout_s=2.0)
        try:
            url = f"http://127.0.0.1:{fwd.port}"
            assert _get(url + "/health")[0] == 200
            assert relay.stall() == 1  # the forward's one SSH connection
            t0, status = time.monotonic(), None
            while status != 200 and time.monotonic() - t0 < BOUND_S:
                status = _get(url + "/health", timeout=10)[0]
            assert status == 200, "still no way through the forward"
            assert fwd.breaks == 1 and relay.stats.accepted == 2
        finally:
            fwd.close()
            host.close()


def test_a_dead_tunnel_process_comes_back_on_the_same_port(sshd_server: Sshd) -> None:
    with sim_server() as sim, TunnelEndpoint(SSHHost(sshd_server.options())) as ep:
        url = ep.url(sim.port)
        assert _get(url + "/health")[0] == 200
        (child,) = _tunnel_children()
        os.kill(child, signal.SIGKILL)  # ours: the forward's process, by its pid
        psutil.Process(child).wait(10)
        assert ep.unreachable() is None  # asked: a new process took over the same listener
        assert _get(url + "/health")[0] == 200 and ep.url(sim.port) == url
        assert ep.breaks() == 1 and _tunnel_children() != [child]
    _no_tunnel_left()


_ORPHAN = """
import json, sys, time
from tuner.hosts import SSHOptions
from tuner.hosts.forward_proc import ForwardProcess
fwd = ForwardProcess(SSHOptions(**json.loads(sys.argv[1])), int(sys.argv[2]))
print(fwd._proc.pid, flush=True)
time.sleep(600)
"""


def test_the_tunnel_process_ends_with_the_tuner(sshd_server: Sshd) -> None:
    """A tuner killed with SIGKILL leaves no forward behind: its stdin closes, it exits."""
    opts = json.dumps(dataclasses.asdict(sshd_server.options()))
    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, opts, str(free_port())],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = None
    try:
        assert proc.stdout is not None
        child = psutil.Process(int(proc.stdout.readline()))
        proc.kill()
        proc.wait(10)
        child.wait(10)  # raises TimeoutExpired if it outlives the tuner
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if child is not None and child.is_running():  # a failed test leaves no orphan either
            child.kill()
        if proc.stdout is not None:
            proc.stdout.close()


# -- the lifecycle: the way to the port failing is the world's ---------------------------------


def _sim_spec(port: int) -> LaunchSpec:
    argv = (sys.executable, "-m", "tuner.sim", "--model-path", "sim/model", "--port", str(port))
    return LaunchSpec(argv=(*argv, "--sim-startup-seconds", "0.3"), port=port, cwd="/")


@contextlib.contextmanager
def _server(host, endpoint, tmp_path: Path) -> Iterator[Server]:
    server = Server(host, Timeouts(ready_s=60, stop_s=5, port_free_s=3, poll_s=0.2, http_s=2),
                    endpoint=endpoint)  # fmt: skip
    pgids: list[int] = []
    try:
        yield server
    finally:
        if server.pgid is not None:
            pgids.append(server.pgid)
        server.stop()
        endpoint.close()
        for g in pgids:
            assert_group_gone(g)


def test_start_through_the_tunnel_then_down_at_once(sshd_server: Sshd, tmp_path: Path) -> None:
    """Commands go straight to sshd; the tunnel goes through a relay that then refuses."""
    host = SSHHost(sshd_server.options())
    with Relay(sshd_server.port) as relay:
        once = dataclasses.replace(sshd_server.relayed(relay.port, tmp_path), reconnect_attempts=1)
        tunnel = TunnelEndpoint(SSHHost(once))
        with _server(host, tunnel, tmp_path) as server:
            res = server.restart(_sim_spec(free_port()), str(tmp_path / "a.log"))
            assert res.ok, res.reason
            assert server._url("/health").startswith("http://127.0.0.1:")
            relay.refuse(None)
            relay.cut()
            t0 = time.monotonic()
            with pytest.raises(HostUnreachable, match=r"tunnel .* is down"):
                server.restart(_sim_spec(free_port()), str(tmp_path / "b.log"))
            took = time.monotonic() - t0
            print(f"\ntunnel down: HostUnreachable after {took:.1f} s (ready_s 60)")
            assert took < BOUND_S and server.pgid is not None  # the record is kept
    host.close()


def test_a_port_that_listens_out_of_reach_is_the_worlds(tmp_path: Path) -> None:
    """The server listens on 127.0.0.1; the tuner is told to reach it at 127.0.0.2."""
    with _server(LocalHost(), DirectEndpoint("127.0.0.2"), tmp_path) as server:
        server.reach_grace_s = 2.0
        t0 = time.monotonic()
        with pytest.raises(InfraError, match=r"listens on \d+ .* via http://127\.0\.0\.2"):
            server.restart(_sim_spec(free_port()), str(tmp_path / "c.log"))
        assert time.monotonic() - t0 < BOUND_S


# -- studies ------------------------------------------------------------------------------------


def _ssh_study(
    tmp: Path, name: str, sshd: Sshd, host: str, ssh: dict, n: int, **workload: object
) -> Path:
    path = study_file(tmp, name, n_trials=n)
    data = yaml.safe_load(path.read_text())
    ssh = {"use_agent": False, "look_for_keys": False, **ssh}
    data["target"].update(host=host, ssh=ssh, workdir=str(tmp))
    data["budget"].update(confirm_top=0)
    # a few dozen streams through the tunnel: enough to have requests in flight, few enough
    # that a busy machine's load client keeps up (a lagging client's run is flagged, not scored)
    data["space"]["concurrency"].update(low=8, high=32)
    data["workload"].update(workload)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _trials(runs: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{runs / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage).trials


def _groups_gone(trials: list[optuna.trial.FrozenTrial]) -> None:
    for t in trials:
        if t.user_attrs.get(Attr.SERVER_PGID):
            assert_group_gone(int(t.user_attrs[Attr.SERVER_PGID]))


def test_a_study_on_an_ssh_config_alias(sshd_server: Sshd, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        socket.getaddrinfo(ALIAS, None)  # only ssh_config knows it: a direct URL cannot work
    conf = tmp_path / "ssh_config"
    conf.write_text(
        f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n  User root\n"
        f"  IdentityFile {sshd_server.client_key}\n"
    )
    ssh = {"ssh_config": str(conf), "known_hosts": str(sshd_server.known_hosts)}
    study = _ssh_study(tmp_path, "alias", sshd_server, ALIAS, ssh, 2)
    runs = tmp_path / "runs"

    from tuner.api import build_seams
    from tuner.config.load import load_study

    seams = build_seams(load_study(study), None)
    try:  # the runner's URL is the tunnel's local end, never the alias
        assert isinstance(seams.endpoint, TunnelEndpoint)
        assert seams.runner.base_url.startswith("http://127.0.0.1:")
        assert seams.server.endpoint is seams.endpoint  # /health goes the same way
        assert ALIAS not in seams.runner.base_url
    finally:
        seams.close()

    out = tuner("tune", str(study), "--runs-dir", str(runs), "--no-progress")
    assert out.returncode == 0, out.stderr[-3000:]
    trials = _trials(runs, "alias")
    # measured through the tunnel (whether the TTFT SLO held depends on the machine's speed)
    measured = [t for t in trials if t.user_attrs.get(Attr.STATUS) in MEASURED]
    assert measured, [(t.state.name, t.user_attrs.get(Attr.REASON)) for t in trials]
    assert any(t.user_attrs[Attr.METRICS]["completed"] > 0 for t in measured)
    _groups_gone(trials)


def _in_load(trials_dir: Path) -> int | None:
    """The number of the trial whose load run is under way (its phases.log ends with it)."""
    for log in trials_dir.glob("*/phases.log"):
        with contextlib.suppress(OSError):
            if log.read_text().endswith(" load\n"):
                return int(log.parent.name)
    return None


def _running(port: int) -> float:
    """Requests the server is running now (its own /metrics gauge; 0 when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return 0.0
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("sglang:num_running_reqs"))


def _wait_for_requests_in_load(trials_dir: Path, port: int, proc_done, timeout: float = 120) -> int:
    """The number of the trial whose load run has requests in flight on the server now: not
    only begun (its phases.log says "load" before the run's first /metrics scrape, which a busy
    machine can make last past a fixed delay), so a cut now breaks requests through the tunnel."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert not proc_done(), "the study ended before a load run had requests in flight"
        # the warm-up's single request is over once "load" is logged: these are the run's
        trial = _in_load(trials_dir)
        if trial is not None and _running(port) >= 2 and _in_load(trials_dir) == trial:
            return trial
        time.sleep(0.02)
    raise AssertionError("no load run had requests in flight")


def test_a_tunnel_cut_mid_load_is_the_worlds(sshd_server: Sshd, tmp_path: Path) -> None:
    with Relay(sshd_server.port) as relay:
        known = sshd_server.known_hosts_at(relay.port, tmp_path)
        ssh = {
            "user": "root",
            "port": relay.port,
            "identity_file": str(sshd_server.client_key),
            "known_hosts": str(known),
            "ssh_config": "",
        }
        # a 5 s window: seconds of requests in flight to cut, however slowly a busy machine
        # starts them
        study = _ssh_study(tmp_path, "cut", sshd_server, "127.0.0.1", ssh, 2, duration_s=5)
        port = yaml.safe_load(study.read_text())["target"]["port"]
        runs = tmp_path / "runs"
        cmd = [*TUNER, "tune", str(study), "--runs-dir", str(runs)]
        proc = subprocess.Popen(
            [*cmd, "--no-progress"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            trials_dir = runs / "cut" / "trials"
            cut = _wait_for_requests_in_load(trials_dir, port, lambda: proc.poll() is not None)
            assert relay.cut() >= 2  # the command connection and the tunnel's
            _, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert proc.returncode == 0, err[-3000:]
    trials = _trials(runs, "cut")
    failed = trials[cut]
    print(f"\ntrial {cut} after the cut: {failed.state.name} {failed.user_attrs}")
    assert failed.state.name == "FAIL"  # the world's: no constraint, no value
    assert "broke during the load run" in failed.user_attrs[Attr.INFRA_ERROR]
    assert Attr.STATUS not in failed.user_attrs  # never recorded as the configuration's
    retry = [t for t in trials if t.user_attrs.get(Attr.RETRY_OF) == cut]
    assert retry, "the cut trial was not retried"
    again = retry[0].user_attrs
    if again.get(Attr.STATUS) == Status.FLAGGED:
        # the retry's load run went through the re-established tunnel, but a busy machine made
        # the load client lag: not trusted (the world's again), yet every request came back
        assert retry[0].state.name == "FAIL" and again[Attr.METRICS]["errors"] == 0, again
        assert again[Attr.METRICS]["completed"] > 0, again
    else:
        assert retry[0].state.name == "COMPLETE", again
        assert again[Attr.STATUS] in MEASURED, again
    assert relay.stats.accepted >= 4  # both connections came back
    _groups_gone(trials)


def test_a_tunnel_stalled_mid_load_is_the_worlds(sshd_server: Sshd, tmp_path: Path) -> None:
    with Relay(sshd_server.port) as relay:
        known = sshd_server.known_hosts_at(relay.port, tmp_path)
        ssh = {
            "user": "root",
            "port": relay.port,
            "identity_file": str(sshd_server.client_key),
            "known_hosts": str(known),
            "ssh_config": "",
        }
        # a 5 s window: seconds of requests in flight to cut, however slowly a busy machine
        # starts them
        study = _ssh_study(tmp_path, "stall", sshd_server, "127.0.0.1", ssh, 2, duration_s=5)
        port = yaml.safe_load(study.read_text())["target"]["port"]
        runs = tmp_path / "runs"
        cmd = [*TUNER, "tune", str(study), "--runs-dir", str(runs)]
        proc = subprocess.Popen(
            [*cmd, "--no-progress"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            trials_dir = runs / "stall" / "trials"
            cut = _wait_for_requests_in_load(trials_dir, port, lambda: proc.poll() is not None)
            assert relay.stall() >= 2  # the command connection and the tunnel's: silent
            _, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert proc.returncode == 0, err[-3000:]
    trials = _trials(runs, "stall")
    failed = trials[cut]
    print(f"\ntrial {cut} after the stall: {failed.state.name} {failed.user_attrs}")
    assert failed.state.name == "FAIL"  # the world's: no constraint, no value
    # the link fell silent: seen as a tunnel that broke, or a server that stopped answering
    # through it (the world's either way: not the configuration's)
    assert "during the load run" in failed.user_attrs[Attr.INFRA_ERROR]
    # never recorded as the configuration's
    assert failed.user_attrs.get(Attr.STATUS, Status.WORLD) == Status.WORLD
    retry = [t for t in trials if t.user_attrs.get(Attr.RETRY_OF) == cut]
    assert retry, "the cut trial was not retried"
    again = retry[0].user_attrs
    if again.get(Attr.STATUS) == Status.FLAGGED:
        # the retry's load run went through the re-established tunnel, but a busy machine made
        # the load client lag: not trusted (the world's again), yet every request came back
        assert retry[0].state.name == "FAIL" and again[Attr.METRICS]["errors"] == 0, again
        assert again[Attr.METRICS]["completed"] > 0, again
    else:
        assert retry[0].state.name == "COMPLETE", again
        assert again[Attr.STATUS] in MEASURED, again
    assert relay.stats.accepted >= 4  # both connections came back
    _groups_gone(trials)
