"""SSHHost: a remote GPU machine over paramiko.

Trust: host keys are verified against a known_hosts file (RejectPolicy); an unknown key is accepted
only with `trust_unknown_host_key=True`, for this session only (never written back), and a
*changed* key is always refused. Both, and refused credentials, raise HostTrustError and are never
retried. Connection failures (SSHException, OSError, EOFError) are retried with tenacity and end as
HostUnreachable. Commands drain stdout and stderr together under a deadline; they also run under
the remote `timeout` so a command we gave up on does not linger on the host.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from tuner.config.target import SSHSection
from tuner.config.yamlfile import special_file
from tuner.errors import CommandTimeout, ConfigError, HostTrustError, HostUnreachable, InfraError
from tuner.hosts.base import CommandResult, ShellHost

log = logging.getLogger(__name__)

DEFAULT_SSH_CONFIG = "~/.ssh/config"


#: the study file's defaults are the only ones: SSHOptions takes its defaults from them
_D = SSHSection()


@dataclass(frozen=True)
class SSHOptions:
    """How to reach and trust one SSH host (the study file's `target.ssh` section, plus the host).

    The fields mirror `config.schema.SSHSection` (where each is documented) and take their defaults
    from it; `ssh_config` None there means ~/.ssh/config, "" means none.
    """

    #: host name, address or ~/.ssh/config alias
    host: str
    user: str | None = _D.user
    port: int | None = _D.port
    identity_file: str | None = _D.identity_file
    known_hosts: str | None = _D.known_hosts
    trust_unknown_host_key: bool = _D.trust_unknown_host_key
    ssh_config: str | None = DEFAULT_SSH_CONFIG
    password_env: str | None = _D.password_env
    use_agent: bool = _D.use_agent
    look_for_keys: bool = _D.look_for_keys
    connect_timeout_s: float = _D.connect_timeout_s
    banner_timeout_s: float = _D.banner_timeout_s
    auth_timeout_s: float = _D.auth_timeout_s
    channel_timeout_s: float = _D.channel_timeout_s
    command_timeout_s: float = _D.command_timeout_s
    reconnect_attempts: int = _D.reconnect_attempts

    @classmethod
    def from_section(cls, host: str, section: SSHSection) -> SSHOptions:
        """Options for `host` from a validated `target.ssh` section (field names are shared)."""
        values = section.model_dump()
        if values["ssh_config"] is None:
            values["ssh_config"] = DEFAULT_SSH_CONFIG
        return cls(host=host, **values)


class _UnknownHostKey(paramiko.SSHException):
    """Raised by our reject policy; distinct from connection errors so it is never retried."""


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(hostname)


class _TrustUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        # trust on first use, for this connection only: the user asked for it in the study file
        log.warning(
            "ssh %s: accepting unknown %s host key %s (trust_unknown_host_key)",
            hostname,
            key.get_name(),
            key.fingerprint,
        )
        client.get_host_keys().add(hostname, key.get_name(), key)


_NEVER_RETRY = (paramiko.AuthenticationException, paramiko.BadHostKeyException, _UnknownHostKey)
_CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError)


#: paramiko's AuthenticationException messages that mean the link failed, not the credentials
_LINK_DROPPED = ("transport shut down or saw eof", "authentication timeout")


def _link_dropped(exc: paramiko.AuthenticationException) -> bool:
    """A dropped or stalled link during auth: retried like any connection failure."""
    text = str(exc).lower()
    return any(m in text for m in _LINK_DROPPED)


#: where a known_hosts file came from when the study file names none
ALIAS_KNOWN = "UserKnownHostsFile (ssh_config)"


@dataclass(frozen=True)
class _Resolved:
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxyjump: str | None
    known_hosts: tuple[str, ...]  # every file whose keys are trusted (ssh's UserKnownHostsFile)


def _local_file(path: str | None, key: str) -> None:
    """A file the SSH options name must be a regular file: a FIFO would block the read
    forever, a directory fail it later as if the host were down."""
    if not path or not os.path.exists(path) or os.path.realpath(path) == os.devnull:
        return  # /dev/null is the usual "no file" (ssh -F /dev/null, UserKnownHostsFile)
    problem = "a directory, not a file" if os.path.isdir(path) else special_file(Path(path))
    if problem:
        raise ConfigError(f"{path} is {problem}", key=key)


def _check_known_hosts(path: str, key: str = "target.ssh.known_hosts") -> None:
    """known_hosts is read at every connect: a file paramiko cannot read is the user's to fix."""
    _local_file(path, key)
    if os.path.exists(path):
        try:
            paramiko.HostKeys(path)
        except (UnicodeDecodeError, OSError) as exc:
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc.strerror
            raise ConfigError(f"cannot read {path}: {why}", key=key) from None


def _resolve(opts: SSHOptions) -> _Resolved:
    """Apply ~/.ssh/config (if any) under the explicit options, which win like ssh's -l/-p/-i."""
    conf: dict = {}
    if opts.ssh_config:
        path = os.path.expanduser(opts.ssh_config)
        _local_file(path, "target.ssh.ssh_config")
        if os.path.exists(path):
            try:
                conf = dict(paramiko.SSHConfig.from_path(path).lookup(opts.host))
            except Exception as exc:  # paramiko raises assorted errors on a malformed file
                raise ConfigError(f"cannot parse ssh config: {exc}", file=path) from exc
            if (
                not str(conf.get("port", "22")).isdigit()
                or not 0 < int(conf.get("port", 22)) < 65536
            ):
                raise ConfigError(
                    f"Port {conf['port']!r} for {opts.host}: expected 1..65535", file=path
                )
    _local_file(os.path.expanduser(opts.identity_file or ""), "target.ssh.identity_file")
    # target.ssh.known_hosts wins; else the alias's UserKnownHostsFile (one or more files), as
    # ssh reads them; else ssh's default
    named = [opts.known_hosts] if opts.known_hosts else conf.get("userknownhostsfile", "").split()
    known = tuple(os.path.expanduser(k) for k in named or ["~/.ssh/known_hosts"])
    for path in known:
        _check_known_hosts(path, "target.ssh.known_hosts" if opts.known_hosts else ALIAS_KNOWN)
    ids = [opts.identity_file] if opts.identity_file else list(conf.get("identityfile", []))
    # OpenSSH's default identity files are in the config lookup only when named; keep the named
    # ones that exist, so a missing default does not fail key loading
    ids = [os.path.expanduser(i) for i in ids]
    if opts.identity_file and not os.path.exists(ids[0]):
        raise ConfigError(f"identity file {ids[0]} does not exist", key="target.ssh.identity_file")
    proxyjump = conf.get("proxyjump")
    if proxyjump and proxyjump.lower() == "none":
        proxyjump = None
    return _Resolved(
        hostname=conf.get("hostname", opts.host),
        port=int(opts.port or conf.get("port", 22)),
        user=opts.user or conf.get("user") or os.environ.get("USER", "root"),
        identity_files=tuple(i for i in ids if os.path.exists(i)),
        proxyjump=proxyjump,
        known_hosts=known,
    )


def _parse_jump(spec: str) -> tuple[str, str | None, int | None]:
    """`[user@]host[:port]` (the first hop of a ProxyJump list) -> (host, user, port)."""
    first = spec.split(",")[0].strip()
    user = None
    if "@" in first:
        user, first = first.rsplit("@", 1)
    port = None
    if first.count(":") == 1:
        first, p = first.split(":")
        port = int(p)
    return first, user, port


class SSHHost(ShellHost):
    """A host reached over SSH; connects lazily and reconnects after a dropped connection."""

    def __init__(self, options: SSHOptions):
        self.options = options
        self._target = _resolve(options)
        self.address = self._target.hostname
        self.name = f"ssh {self._target.user}@{self._target.hostname}:{self._target.port}"
        self.command_timeout_s = options.command_timeout_s
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[SSHHost] = []

    # -- connection -------------------------------------------------------------------------

    def _password(self) -> str | None:
        name = self.options.password_env
        if not name:
            return None
        if name not in os.environ:
            raise ConfigError(
                f"environment variable {name} is not set", key="target.ssh.password_env"
            )
        return os.environ[name]

    def _connect_once(self) -> paramiko.SSHClient:
        o, t = self.options, self._target
        sock = None
        if t.proxyjump:
            host, user, port = _parse_jump(t.proxyjump)
            jump = SSHHost(replace(o, host=host, user=user, port=port, identity_file=None))
            self._jumps.append(jump)
            transport = jump.transport()
            sock = transport.open_channel(
                "direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=o.channel_timeout_s
            )
        client = paramiko.SSHClient()
        for known in t.known_hosts:
            if os.path.exists(known):
                client.load_host_keys(known)
        client.set_missing_host_key_policy(
            _TrustUnknown() if o.trust_unknown_host_key else _RejectUnknown()
        )
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                password=self._password(),
                key_filename=list(t.identity_files) or None,
                timeout=o.connect_timeout_s,
                banner_timeout=o.banner_timeout_s,
                auth_timeout=o.auth_timeout_s,
                channel_timeout=o.channel_timeout_s,
                allow_agent=o.use_agent,
                look_for_keys=o.look_for_keys,
                sock=sock,
            )
        except paramiko.AuthenticationException as exc:
            client.close()
            if _link_dropped(exc):
                raise EOFError(f"connection dropped during authentication: {exc}") from None
            raise
        except BaseException:
            client.close()
            raise
        return client

    def _connect(self) -> paramiko.SSHClient:
        """Connect with retries on connection errors; trust and auth failures are final."""
        o, t = self.options, self._target
        where = f"ssh {t.hostname}:{t.port}"
        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(_CONNECTION_ERRORS)
                & retry_if_not_exception_type(_NEVER_RETRY),
                stop=stop_after_attempt(max(1, o.reconnect_attempts)),
                wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.5),
                reraise=True,
            ):
                with attempt:
                    return self._connect_once()
        except _UnknownHostKey:
            raise HostTrustError(
                f"{where}: host key not in known_hosts {' '.join(t.known_hosts)} "
                "(set target.ssh.trust_unknown_host_key: true to accept it)"
            ) from None
        except paramiko.BadHostKeyException:
            raise HostTrustError(
                f"{where}: host key differs from the one in known_hosts "
                f"{' '.join(t.known_hosts)} (possible man-in-the-middle; fix known_hosts)"
            ) from None
        except paramiko.AuthenticationException as exc:
            raise HostTrustError(
                f"{where}: authentication refused for user {t.user}: {exc}"
            ) from None
        except _CONNECTION_ERRORS as exc:
            raise HostUnreachable(
                f"{where}: cannot connect after {o.reconnect_attempts} attempts: {exc}"
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def transport(self) -> paramiko.Transport:
        """The live transport, connecting (with retries) if needed."""
        if self._client is not None:
            tr = self._client.get_transport()
            if tr is not None and tr.is_active():
                return tr
            self._drop()
        self._client = self._connect()
        tr = self._client.get_transport()
        assert tr is not None
        return tr

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for j in self._jumps:
            j.close()
        self._jumps.clear()

    def close(self) -> None:
        """Close the connection (and jump hosts); detached servers keep running."""
        self._drop()

    # -- commands ---------------------------------------------------------------------------

    def run_shell(
        self, script: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        """Run `bash -c script` remotely; one reconnect and retry after a dropped connection.

        Our helper scripts are idempotent, and `start_detached` prints the pid only once the
        process exists, so a retry after a drop can at worst start a second server whose pgid
        we never learn; the stop-by-pgid check keeps that from killing anything else.
        """
        limit = self.command_timeout_s if timeout is None else timeout
        try:
            return self._exec(script, limit, stdin)
        except CommandTimeout:
            raise
        except _CONNECTION_ERRORS as exc:
            if isinstance(exc, _NEVER_RETRY):
                raise
            log.warning("%s: connection dropped (%s); reconnecting", self.name, exc)
            self._drop()
        try:
            return self._exec(script, limit, stdin)
        except CommandTimeout:
            raise
        except _CONNECTION_ERRORS as exc:
            self._drop()
            raise HostUnreachable(f"{self.name}: connection dropped: {exc}") from exc

    def _exec(self, script: str, limit: float, stdin: bytes | None = None) -> CommandResult:
        deadline = time.monotonic() + limit
        # the remote `timeout` ends a command we gave up on; +2 s so our deadline fires first
        remote = f"timeout -k 2 {limit + 2:.0f} bash -c {shlex.quote(script)}"
        chan = self.transport().open_session(timeout=self.options.channel_timeout_s)
        try:
            chan.exec_command(remote)
            if stdin is not None:  # e.g. a secret: never on the command line, which ps shows
                chan.sendall(stdin)
            chan.shutdown_write()  # EOF: a script reading stdin ends instead of waiting
            out, err = bytearray(), bytearray()
            pause = 0.001
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    if not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    continue
                if chan.closed:
                    raise EOFError("channel closed before the command finished")
                if time.monotonic() > deadline:
                    raise CommandTimeout(
                        f"{self.name}: command ran past its {limit:g} s deadline: {script[:120]}"
                    )
                if got:
                    pause = 0.001
                else:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
            code = chan.recv_exit_status()
            if code == -1:  # paramiko's value when the channel closed without an exit status
                raise EOFError("connection closed before the command's exit status arrived")
        finally:
            chan.close()
        return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def fetch(self, remote_path: str, local_path: str) -> None:
        """Copy a remote file over SFTP (one reconnect after a drop)."""
        for attempt in (1, 2):
            try:
                sftp = paramiko.SFTPClient.from_transport(self.transport())
                assert sftp is not None
                try:
                    sftp.get_channel().settimeout(self.command_timeout_s)
                    sftp.get(remote_path, local_path)
                finally:
                    sftp.close()
                return
            except FileNotFoundError as exc:
                raise InfraError(f"{self.name}: no file {remote_path} to fetch") from exc
            except _CONNECTION_ERRORS as exc:
                self._drop()
                if attempt == 2:
                    raise HostUnreachable(
                        f"{self.name}: fetch {remote_path} failed: {exc}"
                    ) from exc
