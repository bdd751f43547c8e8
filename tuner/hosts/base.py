"""The `Host` seam: what server/lifecycle.py needs from the machine that runs SGLang.

Two implementations (LocalHost, SSHHost) pass one contract suite
(tests/integration/hosts/test_hosts_contract.py). Both speak the same POSIX shell: `ShellHost` builds
every helper (signal a group, is it alive, tail a file, is a port free, ...) as a shell command
from quoted values, so an implementation only has to run a shell script under a deadline, fetch a
file and close. Linux hosts only (SGLang is Linux-only): helpers read /proc.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tuner.errors import InfraError

#: a detached process writes its exit status here (`<log>.exit`) when it ends on its own
EXIT_SUFFIX = ".exit"
#: "PID NONCE" of the last detached start with this log (makes a retried start idempotent)
PID_SUFFIX = ".pid"


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left: exit code and both streams (decoded, errors replaced)."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@runtime_checkable
class Host(Protocol):
    """A machine we can run commands on. All methods raise InfraError subclasses on failure."""

    #: for messages: "local" or "ssh user@host:port"
    name: str
    #: where the host's TCP ports are reached from the tuner (HTTP address of the server)
    address: str

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        """Run one command (each argument quoted) under a deadline; CommandTimeout past it."""
        ...

    def run_shell(
        self, script: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        """Run a bash script (the caller quoted its values) under a deadline; `stdin` is sent
        to it (how secrets travel: a script argument is visible in `ps`, stdin is not)."""
        ...

    def start_detached(
        self,
        command: str,
        *,
        log_path: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        cleanup: Sequence[str] = (),
    ) -> int:
        """Start `command` (a shell command line) in its own session; return its pgid (= pid).

        `env` (not for secrets: it is on the start script's command line) is inherited by the
        whole group; the files in `cleanup` are removed when the command ends.
        """
        ...

    def write_file(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write `text` to `path` (created with `mode`, never wider), through the shell's stdin."""
        ...

    def marked_groups(self, name: str, value: str) -> list[tuple[int, str]]:
        """(pgid, command) of every live group with a process whose environment holds exactly
        `NAME=VALUE` (processes whose /proc/PID/environ we cannot read are skipped)."""
        ...

    def port_holders(self, port: int) -> list[tuple[int, str]]:
        """(pid, command) of the processes listening on TCP `port` that we can see."""
        ...

    def signal_group(self, pgid: int, signal: str) -> bool:
        """Send `signal` (TERM, KILL, 0) to process group `pgid`; False if no such group."""
        ...

    def group_alive(self, pgid: int) -> bool:
        """True while any non-zombie process of group `pgid` exists."""
        ...

    def group_pids(self, pgid: int) -> list[int]:
        """The live (non-zombie) pids of group `pgid`."""
        ...

    def cmdline(self, pid: int) -> str | None:
        """/proc/PID/cmdline with NULs as spaces, or None when the process is gone."""
        ...

    def read_tail(self, path: str, lines: int = 50) -> list[str]:
        """The last `lines` lines of a text file ([] if it does not exist)."""
        ...

    def fetch(self, remote_path: str, local_path: str) -> None:
        """Copy a file from the host to a local path."""
        ...

    def port_free(self, port: int) -> bool:
        """True when nothing listens on TCP `port` (IPv4 or IPv6) on the host."""
        ...

    def which(self, command: str) -> str | None:
        """Path of `command` on the host's PATH, or None."""
        ...

    def close(self) -> None:
        """Release connections; detached processes keep running."""
        ...


def quote_argv(argv: Sequence[str]) -> str:
    """One shell command line from argv, every value quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def detached_script(
    command: str,
    *,
    log_path: str,
    cwd: str | None,
    nonce: str,
    env: Mapping[str, str] | None = None,
    cleanup: Sequence[str] = (),
) -> str:
    """The shell script that starts `command` so that PID = process group = session.

    `nohup setsid bash -c INNER > log 2>&1 < /dev/null &` makes the server outlive the SSH session
    (without the redirects the channel never closes). `setsid` only takes effect after an exec,
    so the script waits until /proc shows pgid == pid before it prints the pid: callers may then
    signal the group at once. The inner shell records the exit status in `<log>.exit`.
    The script is idempotent per `nonce`: `<log>.pid` holds "PID NONCE", and a rerun after a
    dropped connection prints that pid instead of starting a second server.
    The log, `.pid` and `.exit` are created under umask 077 (a server log holds its arguments);
    the command itself runs with the caller's umask, so files the server creates are as usual.
    `env` is set on the session leader, so every process of the group inherits it; the files
    in `cleanup` are removed when the command ends.
    """
    exit_q = shlex.quote(log_path + EXIT_SUFFIX)
    pid_q = shlex.quote(log_path + PID_SUFFIX)
    # $1 is the caller's umask (a positional parameter: no variable leaks into the server).
    # `trap : TERM` (a handler, not an ignore: the command still gets the default action) keeps
    # the leader alive after a TERM of the group until the command ended, to record it and clean
    inner = f'trap : TERM; ( umask "$1"; {command} ); echo $? > {exit_q}'
    if cleanup:
        inner += f"; rm -f -- {quote_argv(cleanup)}"
    if cwd:
        inner = f"cd {shlex.quote(cwd)} && {inner}"
    assigns = "".join(f"{_env_name(k)}={shlex.quote(str(v))} " for k, v in (env or {}).items())
    return (
        f"if [ -s {pid_q} ] && [ \"$(cut -d' ' -f2 {pid_q})\" = {shlex.quote(nonce)} ]; then "
        f"cut -d' ' -f1 {pid_q}; exit 0; fi; "
        "o=$(umask); umask 077; "
        f"mkdir -p -- {shlex.quote(posixpath.dirname(log_path) or '.')}; "
        f"rm -f -- {exit_q} {pid_q} {shlex.quote(log_path)}; "
        f'{assigns}nohup setsid bash -c {shlex.quote(inner)} tuner-server "$o" '
        f"> {shlex.quote(log_path)} 2>&1 < /dev/null & "
        f"p=$!; {GROUP_WAIT}; "
        f'echo "$p {nonce}" > {pid_q}; echo $p'
    )


#: after `nohup setsid X &` and `p=$!`: wait (5 s at most) until process $p leads its own group.
#: setsid makes the group only once it runs, and until then the pid names no group to poll or
#: signal
GROUP_WAIT = (
    'i=0; while [ -e /proc/$p ] && [ "$(cut -d" " -f5 /proc/$p/stat 2>/dev/null)" != "$p" ] '
    "&& [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done"
)


def _env_name(name: str) -> str:
    if not name.isidentifier() or not name.isascii():
        raise ValueError(f"bad environment variable name {name!r}")
    return name


def group_pids_script(pgid: int) -> str:
    # ps prints every process; zombies (STAT Z) are dead for our purpose (PID 1 reaps them later)
    return f"ps -e -o pid=,pgid=,stat= | awk -v g={int(pgid)} '$2 == g && $3 !~ /^Z/ {{print $1}}'"


def port_listen_script(port: int) -> str:
    # /proc/net/tcp{,6}: local address is HEXIP:HEXPORT, state 0A is LISTEN
    hexport = f"{int(port):04X}"
    return (
        f"cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | "
        f"awk '$2 ~ /:{hexport}$/ && $4 == \"0A\" {{n++}} END {{print n+0}}'"
    )


def write_file_script(path: str, mode: int) -> str:
    """Copy stdin to `path` atomically (temp file + rename), never readable beyond `mode`."""
    q = shlex.quote(path)
    tmp = shlex.quote(f"{path}.tmp{secrets.token_hex(4)}")
    return (
        f"umask 077; mkdir -p -- {shlex.quote(posixpath.dirname(path) or '.')} && "
        f"cat > {tmp} && chmod {mode:o} {tmp} && mv -f -- {tmp} {q} || {{ rm -f -- {tmp}; exit 1; }}"
    )


def mask_file_script(path: str, replacement: str) -> str:
    """Replace every secret (one per stdin line, longest first) in the text file `path` by
    `replacement`, literally (awk's index(), no regex), in place; a missing file is fine.

    The secrets come through stdin: on the command line `ps` would show them.
    """
    q = shlex.quote(path)
    tmp = shlex.quote(f"{path}.tmp{secrets.token_hex(4)}")
    prog = (
        "NR == FNR { if (length($0)) s[++n] = $0; next } "
        '{ for (i = 1; i <= n; i++) { out = ""; line = $0; '
        "while ((j = index(line, s[i])) > 0) { out = out substr(line, 1, j - 1) R; "
        "line = substr(line, j + length(s[i])) } $0 = out line } print }"
    )
    return (
        f"umask 077; [ -f {q} ] || exit 0; "
        f"awk -v R={shlex.quote(replacement)} {shlex.quote(prog)} - {q} > {tmp} "
        f"&& mv -f -- {tmp} {q} || {{ rm -f -- {tmp}; exit 1; }}"
    )


def marked_groups_script(name: str, value: str) -> str:
    """`PGID<TAB>PID<TAB>COMMAND` per live process whose environment holds exactly NAME=VALUE.

    One `grep -z` over every /proc/*/environ (NUL-separated entries, whole-entry match); files
    we may not read are skipped silently (-s). Zombies (state Z) are dead for our purpose.
    """
    needle = shlex.quote(f"{name}={value}")
    return (
        f"for f in $(grep -lszxF -- {needle} /proc/[0-9]*/environ); do "
        'd=${f%/environ}; s=$(sed "s/.*) //" $d/stat 2>/dev/null) || continue; '
        'set -- $s; [ -n "$3" ] && [ "$1" != Z ] || continue; '
        "c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null); "
        'printf "%s\\t%s\\t%s\\n" "$3" "${d#/proc/}" "$c"; done; true'
    )


def port_holders_script(port: int) -> str:
    """`PID<TAB>COMMAND` per process with an fd on a socket listening on TCP `port`.

    /proc/net/tcp{,6} give the listening sockets' inodes; /proc/*/fd links name them
    (`socket:[INODE]`), readable for our own processes only.
    """
    hexport = f"{int(port):04X}"
    return (
        "ino=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | "
        f"awk '$2 ~ /:{hexport}$/ && $4 == \"0A\" && $10 != 0 {{print $10}}'); "
        "for i in $ino; do "
        'find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\\[$i\\]" 2>/dev/null; '
        "done | cut -d/ -f3 | sort -un | while read -r p; do "
        "c=$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null); "
        '[ -n "$c" ] && printf "%s\\t%s\\n" "$p" "$c"; done; true'
    )


def _pairs(text: str) -> list[tuple[int, str]]:
    """`NUMBER<TAB>TEXT` lines -> [(number, text)], first per number, malformed lines dropped."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        num, _, rest = line.partition("\t")
        if num.strip().isdigit():
            out.setdefault(int(num), rest.strip())
    return list(out.items())


class ShellHost:
    """Everything but running a script, fetching a file and closing, built on `run_shell`."""

    name: str = "host"
    address: str = "127.0.0.1"
    #: deadline of helper commands (tail, signal, ps ...)
    command_timeout_s: float = 30.0

    def run_shell(
        self, script: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        raise NotImplementedError

    def fetch(self, remote_path: str, local_path: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release by default."""

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        """Run one command, each argument quoted, under a deadline."""
        return self.run_shell(quote_argv(argv), timeout=timeout)

    def start_detached(
        self,
        command: str,
        *,
        log_path: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        cleanup: Sequence[str] = (),
    ) -> int:
        """Start `command` in its own session writing to `log_path`; return its pgid."""
        nonce = secrets.token_hex(8)
        script = detached_script(
            command, log_path=log_path, cwd=cwd, nonce=nonce, env=env, cleanup=cleanup
        )
        res = self._checked(script)
        return int(res.stdout.strip().splitlines()[-1])

    def write_file(self, path: str, text: str, mode: int = 0o600) -> None:
        """Stream `text` to `path` through stdin (never on a command line), created with `mode`."""
        if mode & ~0o777:
            raise ValueError(f"bad file mode {mode:o}")
        res = self.run_shell(
            write_file_script(path, mode), timeout=self.command_timeout_s, stdin=text.encode()
        )
        if not res.ok:
            raise InfraError(
                f"{self.name}: cannot write {path} (exit {res.exit_code}): "
                f"{(res.stderr or res.stdout).strip()[:200]}"
            )

    def marked_groups(self, name: str, value: str) -> list[tuple[int, str]]:
        """Live groups whose processes carry NAME=VALUE in their environment: (pgid, command)."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"bad environment variable name {name!r}")
        out: dict[int, str] = {}
        for line in self._checked(marked_groups_script(name, value)).stdout.splitlines():
            pgid, pid, command = [*line.split("\t", 2), "", ""][:3]
            if not (pgid.isdigit() and pid.isdigit()):
                continue
            if pgid == pid or int(pgid) not in out:  # the leader's command names the group
                out[int(pgid)] = command.strip()
        return sorted(out.items())

    def port_holders(self, port: int) -> list[tuple[int, str]]:
        """(pid, command) of the visible processes listening on TCP `port`."""
        return _pairs(self._checked(port_holders_script(port)).stdout)

    def signal_group(self, pgid: int, signal: str) -> bool:
        """`kill -SIG -- -PGID`; False when the group does not exist."""
        sig = {"0": "0"}.get(str(signal), str(signal).removeprefix("SIG"))
        if not sig.isalnum():
            raise ValueError(f"bad signal name {signal!r}")
        res = self.run_shell(
            f"kill -{sig} -- -{int(pgid)} 2>/dev/null", timeout=self.command_timeout_s
        )
        return res.ok

    def group_pids(self, pgid: int) -> list[int]:
        """Live (non-zombie) members of group `pgid`."""
        res = self._checked(group_pids_script(pgid))
        return [int(x) for x in res.stdout.split()]

    def group_alive(self, pgid: int) -> bool:
        """True while a non-zombie member of group `pgid` exists."""
        return bool(self.group_pids(pgid))

    def cmdline(self, pid: int) -> str | None:
        """Command line of `pid` (NULs turned to spaces), None if the process is gone."""
        res = self.run_shell(
            f"test -e /proc/{int(pid)} && tr '\\0' ' ' < /proc/{int(pid)}/cmdline",
            timeout=self.command_timeout_s,
        )
        # a zombie keeps its /proc entry with an empty cmdline: gone for our purpose
        return res.stdout.rstrip() or None if res.ok else None

    def read_tail(self, path: str, lines: int = 50) -> list[str]:
        """Last `lines` lines of `path`; [] when the file is missing."""
        q = shlex.quote(path)
        res = self.run_shell(
            f"test -f {q} && tail -n {int(lines)} -- {q}", timeout=self.command_timeout_s
        )
        return res.stdout.splitlines() if res.ok else []

    def port_free(self, port: int) -> bool:
        """True when no socket listens on TCP `port`."""
        res = self._checked(port_listen_script(port))
        return int(res.stdout.strip() or "0") == 0

    def which(self, command: str) -> str | None:
        """`command -v`: the path, or None when not on PATH."""
        res = self.run_shell(
            f"command -v -- {shlex.quote(command)}", timeout=self.command_timeout_s
        )
        out = res.stdout.strip()
        return out.splitlines()[0] if res.ok and out else None

    def _checked(self, script: str) -> CommandResult:
        """Run a helper script that must succeed; a failure is the host's, not the user's."""
        res = self.run_shell(script, timeout=self.command_timeout_s)
        if not res.ok:
            raise InfraError(
                f"{self.name}: helper command failed (exit {res.exit_code}): "
                f"{(res.stderr or res.stdout).strip()[:200]}"
            )
        return res
