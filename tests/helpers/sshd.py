"""A real OpenSSH server on 127.0.0.1 for tests, and hosts over it.

`sshd_server` (session fixture) generates host and client keys in a temp dir, writes its own
sshd_config, known_hosts and client ssh config (aliases `tuner-test` and `tuner-jumped`, the
latter through ProxyJump), starts `/usr/sbin/sshd -D -e` on a free port in its own process
group and kills that group (and the per-connection sessions it forked) at teardown.
The user's ~/.ssh is never read: every SSHOptions built here names its files explicitly.

Without /usr/sbin/sshd the SSH tests fail in CI (CI=true) and skip elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from tests.helpers.net import free_port
from tests.helpers.orphans import DIE_WITH_PARENT
from tuner.hosts import LocalHost, SSHHost, SSHOptions

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class Sshd:
    """A running test sshd and the files a client needs."""

    port: int
    pid: int
    dir: Path
    client_key: Path
    known_hosts: Path
    ssh_config: Path

    def options(self, **over: object) -> SSHOptions:
        """SSHOptions for root@127.0.0.1 on this sshd, user files never consulted."""
        base = SSHOptions(
            host="127.0.0.1",
            user="root",
            port=self.port,
            identity_file=str(self.client_key),
            known_hosts=str(self.known_hosts),
            ssh_config="",
            use_agent=False,
            look_for_keys=False,
            connect_timeout_s=5.0,
            banner_timeout_s=5.0,
            auth_timeout_s=5.0,
            channel_timeout_s=5.0,
            command_timeout_s=20.0,
            reconnect_attempts=3,
        )
        return replace(base, **over)  # type: ignore[arg-type]

    def known_hosts_at(self, port: int, directory: Path) -> Path:
        """A known_hosts file with this sshd's key under another port (a relay in front)."""
        key = self.known_hosts.read_text().split(None, 1)[1]
        path = directory / f"known_hosts-{port}"
        path.write_text(f"[127.0.0.1]:{port} {key}")
        return path

    def relayed(self, port: int, directory: Path) -> SSHOptions:
        """Options through a relay on `port`: short deadlines, few retries, so cuts show fast."""
        return self.options(
            port=port,
            known_hosts=str(self.known_hosts_at(port, directory)),
            connect_timeout_s=3.0,
            banner_timeout_s=3.0,
            auth_timeout_s=3.0,
            channel_timeout_s=3.0,
            command_timeout_s=10.0,
            reconnect_attempts=2,
        )


def require_sshd() -> None:
    """Fail in CI, skip elsewhere, when OpenSSH's server is not installed."""
    if os.path.exists(SSHD):
        return
    msg = f"{SSHD} not found: install Debian's openssh-server to run the SSH tests"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on {port} within {deadline_s} s")


def _kill_tree(pid: int) -> None:
    """Kill sshd's group and the per-connection sessions it forked (each its own group)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    groups = {pid}
    for c in children:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            groups.add(os.getpgid(c.pid))
    for g in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(g, signal.SIGTERM)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd on a free 127.0.0.1 port, for the whole session."""
    with _sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="session")
def second_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """Another sshd on its own port and keys: a second "node" of this machine (target.nodes)."""
    with _sshd(tmp_path_factory.mktemp("sshd2")) as server:
        yield server


@contextlib.contextmanager
def _sshd(d: Path) -> Iterator[Sshd]:
    require_sshd()
    _keygen(d / "host_ed25519")
    _keygen(d / "client")
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    os.makedirs("/run/sshd", exist_ok=True)  # privilege separation dir sshd insists on
    host_pub = (d / "host_ed25519.pub").read_text().split()
    proc = None
    for _ in range(3):  # a free port can be taken between bind(0) and sshd's bind: retry
        port = free_port()
        (d / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_ed25519\n"
            f"PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
            "AllowTcpForwarding yes\nMaxStartups 100\nMaxSessions 50\n"
            "Subsystem sftp internal-sftp\n"
            # bash sources ~/.bashrc for commands sshd runs at SHLVL 0; this machine's runs
            # `pyenv init` (~100 processes, 0.15-0.2 s per command, 40% of a restart's time
            # here): the tests measure the tuner, not root's shell start-up
            "SetEnv SHLVL=1\n"
        )
        subprocess.run([SSHD, "-t", "-f", str(d / "sshd_config")], check=True)
        log = d / "sshd.log"
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                [*DIE_WITH_PARENT, SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_listening(port, proc, log, 10.0)
            break
        except RuntimeError:
            _kill_tree(proc.pid)
            proc.wait(5)
            proc = None
    assert proc is not None, "could not start sshd on a free port"
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "ssh_config").write_text(
        f"Host tuner-test\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  IdentityFile {d}/client\n\n"
        f"Host tuner-jumped\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  IdentityFile {d}/client\n  ProxyJump tuner-test\n"
    )
    try:
        yield Sshd(port, proc.pid, d, d / "client", d / "known_hosts", d / "ssh_config")
    finally:
        _kill_tree(proc.pid)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def any_host(request: pytest.FixtureRequest) -> Iterator[LocalHost | SSHHost]:
    """The same tests over LocalHost and over SSHHost to the test sshd."""
    if request.param == "local":
        host: LocalHost | SSHHost = LocalHost(command_timeout_s=20.0)
    else:
        server: Sshd = request.getfixturevalue("sshd_server")
        host = SSHHost(server.options())
    try:
        yield host
    finally:
        host.close()


#: groups whose members all exited; PID 1 reaps their zombies every ~2 s, so the final
#: `os.killpg(pgid, 0)` check runs once per session (see `reaped_groups`) instead of per test
_EXITED_GROUPS: set[int] = set()


def assert_group_gone(pgid: int, deadline_s: float = 10.0) -> None:
    """Every process of group `pgid` has exited (is gone or a zombie awaiting PID 1's reaping).

    The group is remembered; at the end of the session `reaped_groups` asserts that
    `os.killpg(pgid, 0)` raises ProcessLookupError for every one of them.
    """
    end = time.monotonic() + deadline_s
    while True:
        live = _live_members(pgid)
        if not live:
            _EXITED_GROUPS.add(pgid)
            return
        if time.monotonic() > end:
            raise AssertionError(f"process group {pgid} still has processes: {live}")
        time.sleep(0.05)


def assert_groups_reaped(pgids: set[int], deadline_s: float = 15.0) -> None:
    """`os.killpg(pgid, 0)` raises ProcessLookupError for each group (nothing left, not even zombies)."""
    end = time.monotonic() + deadline_s
    left = set(pgids)
    while left:
        for g in list(left):
            try:
                os.killpg(g, 0)
            except ProcessLookupError:
                left.discard(g)
        if left and time.monotonic() > end:
            raise AssertionError(f"process groups still present: {sorted(left)}")
        time.sleep(0.1)


@pytest.fixture(scope="session", autouse=True)
def reaped_groups() -> Iterator[set[int]]:
    """At the end of the session every group a test saw exit is gone for good."""
    yield _EXITED_GROUPS
    assert_groups_reaped(_EXITED_GROUPS)


def _live_members(pgid: int) -> list[dict]:
    out = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.info)
    return out
