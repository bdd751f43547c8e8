"""Where the tuner reaches the server's port (tuner/server/endpoint.py, target.endpoint_for): URL forms,
ssh_config aliases resolved as ssh would, the choice of endpoint, and `ReachWatch`'s verdicts on
a fake clock. No SSH connection is made here (tests/integration/hosts/test_tunnel.py makes them)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tuner.config.target import TargetSection
from tuner.errors import ConfigError, HostUnreachable, InfraError
from tuner.server.endpoint import DirectEndpoint, ReachWatch, TunnelEndpoint, url_for
from tuner.server.target import endpoint_for, host_for, http_hostname


def test_url_forms() -> None:
    assert url_for("127.0.0.1", 30000) == "http://127.0.0.1:30000"
    assert url_for("gpu.example", 8) == "http://gpu.example:8"
    assert url_for("::1", 30000) == "http://[::1]:30000"
    assert DirectEndpoint("fe80::1").url(1) == "http://[fe80::1]:1"


def _target(tmp_path: Path, **over: object) -> TargetSection:
    """An SSH target whose ssh_config maps `gpu-node-1` (and nothing else) to 127.0.0.3."""
    conf = tmp_path / "ssh_config"
    conf.write_text(
        "Host gpu-node-1\n  HostName 127.0.0.3\n  Port 2222\n  User someone\n\n"
        "Host *.lab\n  HostName 127.0.0.4\n"
    )
    ssh = {
        "ssh_config": str(conf),
        "known_hosts": str(tmp_path / "known_hosts"),
        "use_agent": False,
        "look_for_keys": False,
    }
    return TargetSection.model_validate({"host": "gpu-node-1", "ssh": ssh, **over})


def test_an_alias_in_http_host_resolves_like_ssh(tmp_path: Path) -> None:
    assert http_hostname(_target(tmp_path, http_host="gpu-node-1")) == "127.0.0.3"
    assert http_hostname(_target(tmp_path, http_host="x.lab")) == "127.0.0.4"  # patterns too
    assert http_hostname(_target(tmp_path, http_host="127.0.0.2")) == "127.0.0.2"
    assert http_hostname(_target(tmp_path, http_host="::1")) == "::1"


def test_the_endpoint_of_each_target(tmp_path: Path) -> None:
    local = TargetSection(host="local")
    ep = endpoint_for(local, host_for(local))
    assert isinstance(ep, DirectEndpoint) and ep.url(30000) == "http://127.0.0.1:30000"

    target = _target(tmp_path)  # over SSH, no http_host: the tunnel is the default
    host = host_for(target)
    assert host.address == "127.0.0.3"  # the SSH connection resolves the alias too
    ep = endpoint_for(target, host)  # nothing starts before a URL is asked for
    assert isinstance(ep, TunnelEndpoint) and ep.ssh_host is host and ep.remote_host == "127.0.0.1"
    assert ep.unreachable() is None and ep.breaks() == 0
    ep.close()

    aliased = _target(tmp_path, http_host="gpu-node-1")
    ep = endpoint_for(aliased, host_for(aliased))
    assert isinstance(ep, DirectEndpoint) and ep.url(8000) == "http://127.0.0.3:8000"
    v6 = _target(tmp_path, http_host="::1")
    assert endpoint_for(v6, host_for(v6)).url(8000) == "http://[::1]:8000"


def test_a_malformed_ssh_config_names_the_file(tmp_path: Path) -> None:
    target = _target(tmp_path, http_host="gpu-node-1")
    Path(target.ssh.ssh_config or "").write_text("Host gpu-node-1\n  ProxyCommand\n")
    with pytest.raises(ConfigError, match="ssh_config"):
        http_hostname(target)


def test_direct_endpoint_reachability() -> None:
    assert DirectEndpoint("127.0.0.1").unreachable() is None
    why = DirectEndpoint("no-such-host.invalid").unreachable()
    assert why is not None and "cannot resolve no-such-host.invalid" in why
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert DirectEndpoint("127.0.0.1").connects(port, 2.0) is True
    assert DirectEndpoint("127.0.0.1").connects(port, 2.0) is False  # closed: refused
    assert DirectEndpoint("no-such-host.invalid").connects(port, 2.0) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeEndpoint:
    """An endpoint whose state the test sets."""

    def __init__(self) -> None:
        self.down: str | None = None
        self.connect: bool | None = False
        self.probes = 0

    def url(self, port: int) -> str:
        return url_for("127.0.0.1", port)

    def describe(self, port: int) -> str:
        return f"the fake way to {port}"

    def unreachable(self) -> str | None:
        return self.down

    def connects(self, port: int, timeout_s: float) -> bool | None:
        self.probes += 1
        return self.connect

    def breaks(self) -> int:
        return 0

    def close(self) -> None:
        pass


class FakeHost:
    name = "fake-host"

    def __init__(self, listening: bool) -> None:
        self.listening = listening
        self.asked = 0

    def port_free(self, port: int) -> bool:
        self.asked += 1
        return not self.listening


def _watch(
    listening: bool, grace: float = 15.0
) -> tuple[ReachWatch, FakeEndpoint, FakeHost, Clock]:
    ep, host, clock = FakeEndpoint(), FakeHost(listening), Clock()
    return ReachWatch(ep, host, 30000, grace, clock), ep, host, clock


def _poll(watch: ReachWatch, clock: Clock, status: int | None, seconds: float) -> None:
    end = clock.now + seconds
    while clock.now < end:
        watch.check(status)
        clock.now += 1.0


def test_a_tunnel_that_is_down_is_the_worlds_at_once() -> None:
    watch, ep, _, clock = _watch(listening=False)
    watch.check(None)
    ep.down = "the SSH tunnel to port 30000 on ssh root@gpu:22 is down: timed out"
    with pytest.raises(HostUnreachable, match=r"tunnel .* is down.*server port 30000 on fake-host"):
        watch.check(None)


def test_a_port_that_listens_but_cannot_be_reached_is_the_worlds_after_the_grace() -> None:
    watch, ep, host, clock = _watch(listening=True)
    _poll(watch, clock, None, 14.0)  # within the grace: still waiting
    with pytest.raises(InfraError) as err:
        _poll(watch, clock, None, 10.0)
    msg = str(err.value)
    assert "listens on 30000 on fake-host" in msg and "via the fake way to 30000" in msg
    assert "target.http_host" in msg
    assert 15.0 <= clock.now <= 22.0 and host.asked <= 6  # the host is asked sparingly


@pytest.mark.parametrize("case", ["not listening", "answers 503", "accepts, HTTP silent"])
def test_what_is_left_to_the_ready_deadline(case: str) -> None:
    watch, ep, host, clock = _watch(listening=case != "not listening")
    ep.connect = case == "accepts, HTTP silent"  # a hung or slow server, not a way problem
    _poll(watch, clock, 503 if case == "answers 503" else None, 120.0)
    assert ep.probes == (0 if case != "accepts, HTTP silent" else host.asked)


def test_an_answer_resets_the_grace() -> None:
    watch, ep, _, clock = _watch(listening=True)
    _poll(watch, clock, None, 12.0)
    watch.check(503)
    _poll(watch, clock, None, 12.0)  # a fresh grace after the answer
    with pytest.raises(InfraError):
        _poll(watch, clock, None, 12.0)


def test_a_remote_server_is_judged_by_its_endpoint_alone() -> None:
    # a Slurm step or a pod: the tuner's machine holding the port number says nothing of it
    ep, host, clock = FakeEndpoint(), FakeHost(listening=True), Clock()
    watch = ReachWatch(ep, host, 30000, 15.0, clock, remote=True)
    _poll(watch, clock, None, 120.0)
    assert host.asked == 0 and ep.probes == 0
    ep.down = "the port-forward to pod p is down"
    with pytest.raises(HostUnreachable, match="port-forward"):
        watch.check(None)
