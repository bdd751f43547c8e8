"""The checks up to a working shell on the host: the study file, SSH (resolve, connect, host
key, authentication), the remote user and shell, the round-trip time, the workdir."""

from __future__ import annotations

import shlex
import socket
import statistics
import time
from pathlib import Path

from tuner.check.lines import CheckLine, fail, ok, warn
from tuner.check.probe import Probe, said
from tuner.config.load import load_study
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError, HostTrustError, HostUnreachable, SetupError, TunerError
from tuner.hosts.ssh import SSHHost
from tuner.server.target import env_secret, host_for, is_local

#: commands timed for the round trip; the median is reported
RTT_SAMPLES = 3
#: a median round trip above this is worth a warning: a trial runs dozens of host commands
RTT_WARN_MS = 300.0
_SHELL_OK = "tuner-check-shell-ok"


def study_file(path: str | Path) -> tuple[CheckLine, StudyConfig | None]:
    """The study file as `tuner tune` reads it: schema, flag table, model, the API key's
    variable. A mistake is one FAIL line (the same line `tune` prints)."""
    try:
        cfg = load_study(path)
        env_secret(cfg.target.api_key_env, "target.api_key_env", cfg.source)
        if cfg.storage:
            from tuner.study.storage import check_url

            check_url(cfg.storage, file=cfg.source, key="storage")
        if cfg.workload.dataset:
            # the dataset is read as `tune` reads it: a garbage file fails here, not at night
            from tuner.config.validate import request_pool
            from tuner.loadgen.workload import requests_for

            requests_for(cfg.workload, num_requests=request_pool(cfg))
    except TunerError as exc:
        return fail("study", str(exc), type(exc)), None
    n = len([k for k in cfg.space])
    return ok("study", f"{cfg.source}: study '{cfg.study}', {n} parameters searched"), cfg


def connection(p: Probe) -> CheckLine:
    """`host: local` is one ok line; an SSH host is resolved, connected, its key checked and
    our credentials accepted (each failure named with what to do)."""
    target = p.cfg.target
    if is_local(target):
        p.host = host_for(target)
        return ok("host", "local: this machine, no SSH")
    try:
        host = host_for(target)
    except ConfigError as exc:  # a malformed ssh_config, a missing identity file
        return fail("ssh", str(exc), ConfigError)
    assert isinstance(host, SSHHost)
    p.host = host
    try:
        key = host.transport().get_remote_server_key()
    except HostTrustError as exc:
        return fail("ssh", _trust_advice(str(exc), host), HostTrustError)
    except ConfigError as exc:  # password_env names an unset variable
        return fail("ssh", str(exc), ConfigError)
    except HostUnreachable as exc:
        return fail("ssh", _unreachable_advice(exc, host), HostUnreachable)
    return ok(
        "ssh",
        f"{host.name.removeprefix('ssh ')}: host key {key.get_name()} {key.fingerprint} known, "
        "authenticated",
    )


def _trust_advice(text: str, host: SSHHost) -> str:
    o = host.options
    if "not in known_hosts" in text:
        port = f"-p {host.name.rsplit(':', 1)[1]} " if ":" in host.name else ""
        return (
            f"{text}; or add it after checking its fingerprint: "
            f"ssh-keyscan {port}{host.address} >> {o.known_hosts or '~/.ssh/known_hosts'}"
        )
    if "authentication refused" in text:
        return (
            f"{text}; check target.ssh.user and target.ssh.identity_file (or the key in "
            "ssh-agent) and that the key is in the user's authorized_keys"
        )
    return text


def _unreachable_advice(exc: HostUnreachable, host: SSHHost) -> str:
    if isinstance(exc.__cause__, socket.gaierror):
        return (
            f"{exc}; the name does not resolve: fix target.host (a host name, an address or "
            "an alias of target.ssh.ssh_config)"
        )
    return (
        f"{exc}; is the host up, sshd listening on that port (target.ssh.port), and nothing "
        "in between refusing the connection?"
    )


def shell(p: Probe) -> CheckLine:
    """The remote user and login shell run a command (a user without a shell, a forced
    command or a broken profile show here, not at the first trial)."""
    script = f'id -un && printf "%s\\n" "${{SHELL:-unknown}}" && echo {_SHELL_OK}'
    res = p.run(script)
    lines = res.stdout.split()
    if not res.ok or _SHELL_OK not in lines:
        return fail(
            "shell",
            f"{p.where}: the login shell did not run a command (exit {res.exit_code}: "
            f"{said(res)}); give target.ssh.user a working login shell with bash on its PATH "
            "(no ForceCommand or authorized_keys command= for this key)",
            SetupError,
        )
    user, login = [*lines, "?", "?"][:2]
    return ok("shell", f"user {user}, login shell {login}, bash runs")


def round_trip(p: Probe) -> CheckLine:
    """The median time of a trivial command: what every host command costs at least."""
    times = []
    for _ in range(RTT_SAMPLES):
        start = time.monotonic()
        res = p.run("true")
        times.append((time.monotonic() - start) * 1000)
        if not res.ok:
            return fail("round trip", f"`true` failed (exit {res.exit_code})", SetupError)
    median = statistics.median(times)
    text = f"median {median:.0f} ms over {RTT_SAMPLES} commands (max {max(times):.0f} ms)"
    if median > RTT_WARN_MS:
        return warn("round trip", f"{text}: a slow link; every trial runs dozens of commands")
    return ok("round trip", text)


def workdir(p: Probe) -> CheckLine:
    """target.workdir is a directory the user can write (server logs and scripts go there)."""
    wd = p.cfg.target.workdir
    if not wd:
        return ok("workdir", "none given: server logs go to /tmp")
    q = shlex.quote(wd)
    res = p.run(f"test -d {q} || echo missing; test -w {q} || echo read-only")
    if "missing" in res.stdout:
        return fail(
            "workdir",
            f"target.workdir: {wd} is not a directory on {p.where}; create it or fix the path",
            SetupError,
        )
    if "read-only" in res.stdout:
        return fail(
            "workdir",
            f"target.workdir: {wd} is not writable on {p.where} (server logs are written "
            "there); fix its permissions or the path",
            SetupError,
        )
    return ok("workdir", f"{wd} is a writable directory")
