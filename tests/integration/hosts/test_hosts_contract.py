"""One contract for every Host: LocalHost and SSHHost (real sshd on 127.0.0.1) pass the same tests.

Then SSH-only behaviour: host-key trust, authentication, ssh_config aliases, ProxyJump,
reconnect after a dropped connection, unreachable hosts.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.sshd import Sshd, assert_group_gone, assert_groups_reaped
from tuner.errors import CommandTimeout, HostTrustError, HostUnreachable, InfraError
from tuner.hosts import Host, SSHHost
from tuner.server.launch import LaunchSpec

NASTY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "x; echo pwned", "*", "", "tab\there", "é"]


def _detached(host: Host, tmp_path: Path, command: str, name: str = "d") -> int:
    return host.start_detached(command, log_path=str(tmp_path / f"{name}.log"))


def test_is_a_host(any_host: Host) -> None:
    assert isinstance(any_host, Host)
    assert any_host.address == "127.0.0.1"


def test_run_returns_code_and_both_streams(any_host: Host) -> None:
    res = any_host.run_shell("echo out; echo err >&2; exit 7", timeout=10)
    assert (res.exit_code, res.stdout, res.stderr) == (7, "out\n", "err\n")
    assert not res.ok


def test_run_passes_every_argument_verbatim(any_host: Host) -> None:
    res = any_host.run(["printf", "%s\\n", *NASTY], timeout=10)
    assert res.ok, res.stderr
    assert res.stdout.split("\n")[:-1] == NASTY


def test_run_drains_large_output_on_both_streams(any_host: Host) -> None:
    # 3 MiB on each stream: more than any SSH window or pipe buffer (paramiko #1778)
    script = "head -c 3145728 /dev/zero | tr '\\0' a; head -c 3145728 /dev/zero | tr '\\0' b >&2"
    res = any_host.run_shell(script, timeout=60)
    assert res.ok
    assert len(res.stdout) == 3145728 and set(res.stdout) == {"a"}
    assert len(res.stderr) == 3145728 and set(res.stderr) == {"b"}


def test_run_deadline_raises_and_ends_the_command(any_host: Host, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout, match="deadline"):
        any_host.run_shell(f"echo $$ > {pidfile}; exec sleep 30", timeout=1.0)
    assert time.monotonic() - t0 < 10
    # on a loaded machine the shell may start after our deadline passed: it must still be ended
    end = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < end, "the command never started"
        time.sleep(0.1)
    pid = int(pidfile.read_text())
    end = time.monotonic() + 10  # the remote `timeout` ends it 2 s after our deadline
    while os.path.exists(f"/proc/{pid}") and "sleep" in Path(f"/proc/{pid}/cmdline").read_text():
        assert time.monotonic() < end, "command still running after its deadline"
        time.sleep(0.1)


def test_start_detached_makes_a_session_leader(any_host: Host, tmp_path: Path) -> None:
    pgid = _detached(any_host, tmp_path, "echo started; exec sleep 60")
    try:
        assert os.getpgid(pgid) == pgid and os.getsid(pgid) == pgid
        assert any_host.group_alive(pgid)
        assert pgid in any_host.group_pids(pgid)
        assert "sleep 60" in (any_host.cmdline(pgid) or "")
        end = time.monotonic() + 10
        while any_host.read_tail(str(tmp_path / "d.log")) != ["started"]:
            assert time.monotonic() < end
            time.sleep(0.05)
    finally:
        any_host.signal_group(pgid, "KILL")
    assert_group_gone(pgid)
    assert not any_host.group_alive(pgid)
    assert any_host.cmdline(pgid) is None


def test_detached_process_outlives_the_connection(any_host: Host, tmp_path: Path) -> None:
    pgid = _detached(any_host, tmp_path, "sleep 60")
    try:
        any_host.close()
        time.sleep(0.3)
        os.killpg(pgid, 0)  # still there after the SSH session ended
        assert any_host.group_alive(pgid)  # and the host reconnects by itself
    finally:
        any_host.signal_group(pgid, "KILL")
    assert_group_gone(pgid)


def test_signal_group_terms_every_member(any_host: Host, tmp_path: Path) -> None:
    pgid = _detached(any_host, tmp_path, "sleep 60 & sleep 60 & wait")
    try:
        end = time.monotonic() + 10
        while len(any_host.group_pids(pgid)) < 3:
            assert time.monotonic() < end
            time.sleep(0.05)
        assert any_host.signal_group(pgid, "TERM")
        end = time.monotonic() + 10
        while any_host.group_alive(pgid):
            assert time.monotonic() < end, "group survived TERM"
            time.sleep(0.05)
    finally:
        any_host.signal_group(pgid, "KILL")
    assert_group_gone(pgid)
    assert_groups_reaped({pgid})
    assert any_host.signal_group(pgid, "0") is False


def test_exit_status_is_recorded(any_host: Host, tmp_path: Path) -> None:
    pgid = _detached(any_host, tmp_path, "echo bye; exit 3")
    end = time.monotonic() + 10
    while any_host.group_alive(pgid):
        assert time.monotonic() < end
        time.sleep(0.05)
    assert any_host.read_tail(str(tmp_path / "d.log.exit")) == ["3"]
    assert any_host.read_tail(str(tmp_path / "d.log")) == ["bye"]
    assert_group_gone(pgid)


def test_launch_spec_values_reach_the_process_as_single_arguments(
    any_host: Host, tmp_path: Path
) -> None:
    victim = Path(f"/tmp/owned-{secrets.token_hex(6)}")
    evil = f"x; touch {victim}"
    spec = LaunchSpec(
        argv=("python3", "-c", "import sys; print(sys.argv[1:])", "--model-path", evil),
        port=0,
        env={"TUNER_EVIL": f"$(touch {victim})"},
        cwd=str(tmp_path),
    )
    script = spec.shell_command() + '; echo "env=$TUNER_EVIL"'
    pgid = any_host.start_detached(
        f"bash -c {__import__('shlex').quote(script)}", log_path=str(tmp_path / "s.log")
    )
    assert_group_gone(pgid)
    lines = any_host.read_tail(str(tmp_path / "s.log"))
    assert lines[0] == repr(["--model-path", evil])
    assert not victim.exists()


def test_read_tail(any_host: Host, tmp_path: Path) -> None:
    f = tmp_path / "log with space.txt"
    f.write_text("".join(f"line {i}\n" for i in range(100)))
    assert any_host.read_tail(str(f), 3) == ["line 97", "line 98", "line 99"]
    assert any_host.read_tail(str(tmp_path / "missing"), 3) == []


def test_fetch(any_host: Host, tmp_path: Path) -> None:
    src = tmp_path / "remote.log"
    src.write_bytes(os.urandom(300_000))
    dst = tmp_path / "copy.log"
    any_host.fetch(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes()


def test_port_free(any_host: Host) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert any_host.port_free(port)  # bound but not listening
        s.listen()
        assert not any_host.port_free(port)
    assert any_host.port_free(port)


def test_which(any_host: Host) -> None:
    assert (any_host.which("bash") or "").endswith("/bash")
    assert any_host.which("no-such-command-tuner") is None


def _wait_gone(host: Host, pgid: int) -> None:
    end = time.monotonic() + 10
    while host.group_alive(pgid):
        assert time.monotonic() < end, f"group {pgid} still alive"
        time.sleep(0.05)


def test_detached_files_are_private_and_the_command_keeps_the_umask(
    any_host: Host, tmp_path: Path
) -> None:
    """Log, .pid and .exit are 0600 (the log holds the server's args); the command itself
    runs under the host's own umask (files it creates are not forced private)."""
    made = tmp_path / "made-by-command"
    pgid = _detached(any_host, tmp_path, f"umask; : > {made}; echo done")
    _wait_gone(any_host, pgid)
    assert_group_gone(pgid)
    for suffix in ("", ".pid", ".exit"):
        mode = (tmp_path / f"d.log{suffix}").stat().st_mode & 0o777
        assert mode == 0o600, f"d.log{suffix} has mode {mode:o}"
    umask = int(any_host.read_tail(str(tmp_path / "d.log"))[0], 8)
    assert umask != 0o077 and made.stat().st_mode & 0o777 == 0o666 & ~umask


def test_detached_env_reaches_the_group_and_cleanup_runs(any_host: Host, tmp_path: Path) -> None:
    junk = tmp_path / "junk file"
    junk.write_text("x")
    pgid = any_host.start_detached(
        'echo "m=$TUNER_T"; sh -c \'echo "child=$TUNER_T"\'',
        log_path=str(tmp_path / "e.log"),
        env={"TUNER_T": "a b'c"},
        cleanup=[str(junk)],
    )
    _wait_gone(any_host, pgid)
    assert_group_gone(pgid)
    assert any_host.read_tail(str(tmp_path / "e.log")) == ["m=a b'c", "child=a b'c"]
    assert not junk.exists()


def test_cleanup_runs_after_a_term_of_the_group(any_host: Host, tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_text("x")
    pgid = any_host.start_detached(
        "exec sleep 60", log_path=str(tmp_path / "t.log"), cleanup=[str(junk)]
    )
    try:
        end = time.monotonic() + 10
        while len(any_host.group_pids(pgid)) < 2:  # the leader's trap is set by then
            assert time.monotonic() < end
            time.sleep(0.05)
        assert any_host.signal_group(pgid, "TERM")
        _wait_gone(any_host, pgid)
    finally:
        any_host.signal_group(pgid, "KILL")
    assert_group_gone(pgid)
    assert not junk.exists()
    assert any_host.read_tail(str(tmp_path / "t.log.exit")) == ["143"]


@pytest.mark.parametrize("mode", [0o600, 0o700])
def test_write_file_streams_text_with_its_mode(any_host: Host, tmp_path: Path, mode: int) -> None:
    text = "".join(f"{x}\n" for x in NASTY) + "no newline at the end: é"
    path = tmp_path / "sub dir" / "f.yaml"
    any_host.write_file(str(path), text, mode)
    assert path.read_text() == text
    assert path.stat().st_mode & 0o777 == mode
    any_host.write_file(str(path), "again", mode)  # replaces, atomically
    assert path.read_text() == "again"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.yaml"]  # no temp file left


def test_write_file_into_a_missing_place_is_an_infra_error(any_host: Host, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(InfraError, match="cannot write"):
        any_host.write_file(str(tmp_path / "file" / "below"), "x")


def test_marked_groups_finds_groups_by_their_environment(any_host: Host, tmp_path: Path) -> None:
    marker = "tuner-test-" + secrets.token_hex(6)
    marked = any_host.start_detached(
        "sleep 60 & exec sleep 61", log_path=str(tmp_path / "m.log"), env={"TUNER_M": marker}
    )
    other = any_host.start_detached(
        "exec sleep 62", log_path=str(tmp_path / "o.log"), env={"TUNER_M": marker + "x"}
    )
    try:
        found = any_host.marked_groups("TUNER_M", marker)
        assert [pgid for pgid, _ in found] == [marked]  # exact value: the other is not ours
        assert "sleep 61" in found[0][1] or "m.log" in found[0][1]
        assert any_host.marked_groups("TUNER_M", "tuner-test-none") == []
    finally:
        any_host.signal_group(marked, "KILL")
        any_host.signal_group(other, "KILL")
    assert_group_gone(marked)
    assert_group_gone(other)
    assert any_host.marked_groups("TUNER_M", marker) == []


def test_port_holders_names_the_listener(any_host: Host) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        holders = any_host.port_holders(port)
        assert [pid for pid, _ in holders] == [os.getpid()]
        assert "pytest" in holders[0][1] or "python" in holders[0][1]
    assert any_host.port_holders(port) == []


# -- SSH only -------------------------------------------------------------------------------


@pytest.mark.ssh
def test_unknown_host_key_is_refused_in_one_line(sshd_server: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SSHHost(sshd_server.options(known_hosts=str(empty)))
    t0 = time.monotonic()
    with pytest.raises(HostTrustError) as err:
        host.run(["true"])
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (
        f"ssh 127.0.0.1:{sshd_server.port}: host key not in known_hosts {empty} "
        "(set target.ssh.trust_unknown_host_key: true to accept it)"
    )
    assert time.monotonic() - t0 < 5  # not retried
    host.close()


@pytest.mark.ssh
def test_trust_unknown_host_key_accepts_without_writing(sshd_server: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SSHHost(sshd_server.options(known_hosts=str(empty), trust_unknown_host_key=True))
    try:
        assert host.run(["echo", "ok"]).stdout == "ok\n"
    finally:
        host.close()
    assert empty.read_text() == ""


@pytest.mark.ssh
def test_changed_host_key_is_refused_even_when_trusting(sshd_server: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd_server.port} {Path(str(other) + '.pub').read_text()}")
    host = SSHHost(sshd_server.options(known_hosts=str(kh), trust_unknown_host_key=True))
    with pytest.raises(HostTrustError, match="differs"):
        host.run(["true"])


@pytest.mark.ssh
def test_refused_key_is_not_retried(sshd_server: Sshd, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {wrong}")
    host = SSHHost(sshd_server.options(identity_file=str(wrong)))
    with pytest.raises(HostTrustError, match="authentication refused"):
        host.run(["true"])


@pytest.mark.ssh
def test_unreachable_after_retries() -> None:
    from tuner.hosts import SSHOptions

    port = free_port()  # nothing listens there
    host = SSHHost(
        SSHOptions(
            host="127.0.0.1",
            port=port,
            user="root",
            ssh_config="",
            known_hosts="/dev/null",
            use_agent=False,
            look_for_keys=False,
            reconnect_attempts=2,
            connect_timeout_s=2,
        )
    )
    with pytest.raises(HostUnreachable, match="after 2 attempts"):
        host.run(["true"])


def alias_options(sshd_server: Sshd, alias: str):
    """Only an ssh_config alias: HostName, Port, User and IdentityFile come from the file."""
    from tuner.hosts import SSHOptions

    return SSHOptions(
        host=alias,
        ssh_config=str(sshd_server.ssh_config),
        known_hosts=str(sshd_server.known_hosts),
        use_agent=False,
        look_for_keys=False,
    )


@pytest.mark.ssh
def test_ssh_config_alias(sshd_server: Sshd) -> None:
    host = SSHHost(alias_options(sshd_server, "tuner-test"))
    try:
        assert host.name == f"ssh root@127.0.0.1:{sshd_server.port}"
        assert host.run(["whoami"]).stdout == "root\n"
    finally:
        host.close()


@pytest.mark.ssh
@pytest.mark.parametrize("trusted", [True, False])
def test_an_alias_reads_its_own_user_known_hosts_file(
    sshd_server: Sshd, tmp_path: Path, trusted: bool
) -> None:
    """A host behind an ssh_config alias whose key is in the alias's UserKnownHostsFile (not
    ~/.ssh/known_hosts) is trusted, as ssh trusts it; with that file /dev/null it is not."""
    known = sshd_server.known_hosts if trusted else Path(os.devnull)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-box\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n  User root\n"
        f"  IdentityFile {sshd_server.client_key}\n  UserKnownHostsFile {known}\n"
    )
    opts = replace(alias_options(sshd_server, "gpu-box"), ssh_config=str(config), known_hosts=None)
    host = SSHHost(opts)
    try:
        if trusted:
            assert host.run(["whoami"]).stdout == "root\n"
        else:
            with pytest.raises(HostTrustError, match="host key not in known_hosts /dev/null"):
                host.run(["whoami"])
    finally:
        host.close()


@pytest.mark.ssh
def test_proxyjump_through_direct_tcpip(sshd_server: Sshd) -> None:
    host = SSHHost(alias_options(sshd_server, "tuner-jumped"))
    try:
        # the target's peer is the jump host's sshd forwarding from 127.0.0.1
        res = host.run_shell("echo $SSH_CONNECTION")
        assert res.ok and res.stdout.split()[2] == "127.0.0.1"
        assert len(host._jumps) == 1 and host._jumps[0].transport().is_active()
    finally:
        host.close()


@pytest.mark.ssh
def test_reconnects_after_the_transport_drops(sshd_server: Sshd) -> None:
    host = SSHHost(sshd_server.options())
    try:
        assert host.run(["echo", "1"]).stdout == "1\n"
        host.transport().close()  # the connection dies under us
        assert host.run(["echo", "2"]).stdout == "2\n"
    finally:
        host.close()
