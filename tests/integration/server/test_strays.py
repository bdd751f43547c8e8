"""A server is never lost, a held port stops the study, setup mistakes stop at once.

Real processes on LocalHost and over the real sshd (SSHHost), the real simulator as the server:
- a server started with a marker is found by a fresh Server that never recorded its group;
- a port held by an unrelated process (a plain http.server) raises PortHeldError naming its PID;
- a stop whose SSH connection drops keeps the record, and the next stop finishes the job;
- a SIGSTOPped server is not responsive (bounded) and is stopped by TERM + CONT, not a KILL wait;
- a missing launch binary, a non-executable one, a missing workdir raise SetupError before any
  spawn; a command that cannot run (missing module, bad interpreter) raises it after the start.
Every test cleans up by its own unique marker (tests/helpers/procs.py), never by name.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.procs import kill_marked, marked_groups
from tests.helpers.relay import Relay
from tests.helpers.sshd import Sshd, assert_group_gone
from tuner.config.target import Timeouts
from tuner.errors import HostUnreachable, PortHeldError, SetupError
from tuner.hosts import Host, SSHHost
from tuner.server.launch import LaunchSpec
from tuner.server.lifecycle import Server

pytestmark = pytest.mark.slow

T = Timeouts(ready_s=30, stop_s=30, port_free_s=2, gpu_free_s=5, poll_s=0.05, http_s=2)


def sim_spec(port: int, *extra: str, cwd: str | None = "/") -> LaunchSpec:
    argv = (sys.executable, "-m", "tuner.sim", "--model-path", "sim/model", "--port", str(port))
    argv += ("--sim-profile", "llama-3.1-8b-h100", "--sim-startup-seconds", "0.3", *extra)
    return LaunchSpec(argv=argv, port=port, cwd=cwd)


@pytest.fixture
def marker() -> Iterator[str]:
    """A marker unique to the test; whatever still carries it at the end is killed (and fails)."""
    m = "tuner-test-" + secrets.token_hex(8)
    yield m
    left = kill_marked(m)
    assert not left, f"groups left running with the test's marker: {left}"


def test_a_lost_server_is_found_by_its_marker_and_stopped(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    first = Server(any_host, T, marker=marker)
    res = first.restart(sim_spec(free_port()), str(tmp_path / "s1.log"))
    assert res.ok, res
    assert res.pgid in marked_groups(marker)  # the whole group carries it, from the spawn on
    # the tuner that started it is gone (killed before it recorded anything): a fresh one
    fresh = Server(any_host, T, marker=marker)
    assert fresh.pgid is None
    stopped = fresh.stop_strays()
    assert [pgid for pgid, _ in stopped] == [res.pgid]
    assert "s1.log" in stopped[0][1] or "tuner.sim" in stopped[0][1]
    assert_group_gone(res.pgid)
    assert marked_groups(marker) == {}
    assert fresh.stop_strays() == []
    # another worker's marker is not ours
    assert Server(any_host, T, marker=marker + "-other").stop_strays() == []


def test_a_restart_on_a_port_our_stray_holds_stops_it_first(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    port = free_port()
    old = Server(any_host, T, marker=marker).restart(sim_spec(port), str(tmp_path / "a.log"))
    assert old.ok, old
    server = Server(any_host, T, marker=marker)
    new = server.restart(sim_spec(port), str(tmp_path / "b.log"))
    assert new.ok, new
    assert_group_gone(old.pgid)
    assert list(marked_groups(marker)) == [new.pgid]
    server.stop()
    assert_group_gone(new.pgid)


def test_a_port_held_by_an_unrelated_process_stops_the_study(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    port = free_port()
    holder = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=tmp_path,
    )
    try:
        end = time.monotonic() + 20
        while any_host.port_free(port):
            assert holder.poll() is None and time.monotonic() < end, "http.server did not listen"
            time.sleep(0.05)
        server = Server(any_host, T, marker=marker)
        with pytest.raises(PortHeldError) as err:
            server.restart(sim_spec(port), str(tmp_path / "p.log"))
        msg = str(err.value)
        print(f"\n{msg}")
        assert f"port {port} is held by PID {holder.pid} " in msg and "http.server" in msg
        assert "\n" not in msg
        assert server.pgid is None and not (tmp_path / "p.log").exists()  # nothing spawned
        assert holder.poll() is None  # and the holder left alone
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)


@pytest.mark.ssh
def test_a_stop_whose_connection_drops_keeps_the_record(
    sshd_server: Sshd, tmp_path: Path, marker: str
) -> None:
    with Relay(sshd_server.port) as relay:
        host = SSHHost(sshd_server.relayed(relay.port, tmp_path))
        try:
            server = Server(host, T, marker=marker)
            res = server.restart(sim_spec(free_port()), str(tmp_path / "d.log"))
            assert res.ok, res
            relay.refuse(None)
            relay.cut()
            with pytest.raises(HostUnreachable):
                server.stop()
            assert server.pgid == res.pgid  # not forgotten: the group still runs
            assert res.pgid in marked_groups(marker)
            relay.accept()
            server.stop()
            assert server.pgid is None
            assert_group_gone(res.pgid)
        finally:
            host.close()


def test_a_sigstopped_server_is_not_responsive_and_is_stopped(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    server = Server(any_host, T, marker=marker)
    res = server.restart(sim_spec(free_port()), str(tmp_path / "h.log"))
    assert res.ok and res.pgid is not None, res
    assert server.responsive(5.0)
    os.killpg(res.pgid, signal.SIGSTOP)  # alive, not answering: a hung server
    t0 = time.monotonic()
    assert not server.responsive(1.0)
    took = time.monotonic() - t0
    assert took < 10  # bounded by the deadline, not by the server
    assert any_host.group_alive(res.pgid)
    stop_s = server.stop()
    print(f"\nhung server: not responsive in {took:.2f} s, stopped in {stop_s:.2f} s")
    # TERM is delivered once CONT wakes the group: far sooner than the stop_s wait for KILL
    assert stop_s < T.stop_s
    assert_group_gone(res.pgid)


@pytest.mark.parametrize(
    ("launch", "match"),
    [
        ("/nonexistent/binary", r"target\.launch: /nonexistent/binary is not an executable file"),
        ("no-such-sglang-tuner", r"not on the PATH"),
        ("NOT_EXECUTABLE", r"is not an executable file"),
    ],
)
def test_a_launch_command_that_is_not_there_stops_before_any_spawn(
    any_host: Host, tmp_path: Path, marker: str, launch: str, match: str
) -> None:
    if launch == "NOT_EXECUTABLE":
        launch = str(tmp_path / "launch.sh")
        Path(launch).write_text("#!/bin/sh\nexit 0\n")  # mode 0644
    spec = LaunchSpec(argv=(launch, "--port", "1"), port=free_port(), cwd=str(tmp_path))
    server = Server(any_host, T, marker=marker)
    with pytest.raises(SetupError, match=match) as err:
        server.restart(spec, str(tmp_path / "x.log"))
    assert "\n" not in str(err.value)
    assert server.pgid is None and not (tmp_path / "x.log").exists()
    assert not (tmp_path / "x.log.sh").exists()  # nothing written either
    assert marked_groups(marker) == {}


def test_a_missing_workdir_stops_before_any_spawn(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    spec = sim_spec(free_port(), cwd=str(tmp_path / "no such dir"))
    server = Server(any_host, T, marker=marker)
    with pytest.raises(SetupError, match=r"target\.workdir: .*no such dir is not a directory"):
        server.restart(spec, str(tmp_path / "w.log"))
    assert server.pgid is None and not (tmp_path / "w.log").exists()


@pytest.mark.parametrize("case", ["module", "interpreter"])
def test_a_command_that_cannot_run_is_a_setup_error_after_the_start(
    any_host: Host, tmp_path: Path, marker: str, case: str
) -> None:
    if case == "module":  # SGLang not installed in the launch's Python
        argv: tuple[str, ...] = (sys.executable, "-m", "no_such_sglang_tuner.launch_server")
    else:  # the script exists and is executable, its interpreter does not
        script = tmp_path / "launch"
        script.write_text("#!/nonexistent/python3\n")
        script.chmod(0o755)
        argv = (str(script),)
    spec = LaunchSpec(argv=(*argv, "--port", "1"), port=free_port(), cwd=str(tmp_path))
    server = Server(any_host, T, marker=marker)
    t0 = time.monotonic()
    with pytest.raises(SetupError, match=r"target\.launch: the server command cannot run") as err:
        server.restart(spec, str(tmp_path / "m.log"))
    print(f"\n{err.value}")
    assert time.monotonic() - t0 < T.ready_s / 2  # the death, not the ready deadline
    assert server.pgid is None and marked_groups(marker) == {}


def test_a_configuration_failure_is_still_a_result(
    any_host: Host, tmp_path: Path, marker: str
) -> None:
    """SGLang's own message (argparse, exit 2) is the configuration's: no SetupError."""
    server = Server(any_host, T, marker=marker)
    res = server.restart(sim_spec(free_port(), "--no-such-flag"), str(tmp_path / "f.log"))
    assert (res.ok, res.failure, res.exit_code) == (False, "bad_flag", 2)


def test_port_holders_names_a_socket_of_another_session(any_host: Host) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert [pid for pid, _ in any_host.port_holders(s.getsockname()[1])] == [os.getpid()]
