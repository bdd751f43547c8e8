"""The SGLang server's lifecycle on a Host: stop the old one, start, wait ready, verify, classify.

The evidence rule: a failed start or a death is the *configuration's* failure only with SGLang's
own message -- exit code and log lines that `tuner.sglang.failures` classifies into
`CONFIG_FAILURES` (`is_config_failure`: OOMs, not enough memory, HiCache host memory, argparse,
resolved args that differ). Everything else is the *world's*: a timeout or crash without such a
message, a hung server, a dropped connection (InfraError, retried within bounds); a port held by
a process we did not start (PortHeldError: the study stops); the user's setup, i.e. launch
command or workdir missing (SetupError: the study stops at once, exit 2).

`restart(spec, log_path)` returns a `StartResult`: a verified running server (with what it
resolved) or a classified failure with the log lines that show why. Every server started with a
`marker` carries `TUNER_SERVER_MARKER=<marker>` in its whole group's environment from the spawn
on, so `stop_strays` finds one whose group was never recorded. A stop clears its record only once
the group is gone (stopped by process group, never by name, after a PID-reuse check).
Secrets never appear on a command line: the launch is a 0700 script exporting the environment,
secret flags reach SGLang in a 0600 `--config` file removed once it is up, and everything read
back (reasons, log lines, fetched logs, the host's log once the server is gone) is masked.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.config.target import Timeouts
from tuner.errors import InfraError
from tuner.hosts.base import Host, mask_file_script
from tuner.server.endpoint import REACH_GRACE_S, DirectEndpoint, Endpoint, ReachWatch
from tuner.server.gpus import gpu_list, memory_in_use
from tuner.server.hostfacts import port_held_error, setup_error
from tuner.server.info import as_float, as_int, internal, mismatches
from tuner.server.launch import MIN_MASKED_LEN, REDACTED, LaunchSpec, launch_program
from tuner.server.logs import HostLogs, remove
from tuner.server.probes import http_status, server_info
from tuner.server.records import GpuInfo, GpuMemory, ServerDeath, StartResult, Timings
from tuner.server.runtime import DirectRuntime, Runtime
from tuner.sglang.failures import FailureClass, evidence_tail, explain_failure

__all__ = ["MARKER_VAR", "GpuInfo", "Server", "ServerDeath", "StartResult", "Timings"]

OnLaunch = Callable[[int], None] | None
#: the environment variable every server started with a marker carries (its whole group)
MARKER_VAR = "TUNER_SERVER_MARKER"
#: a dead server's log lines read for its evidence (access lines dropped, `tail_lines` kept)
EVIDENCE_SCAN_LINES = 2000
#: next to the log on the host: the launch script (0700) and the secret flags (0600)
SCRIPT_SUFFIX = ".sh"
SECRETS_SUFFIX = ".secrets.yaml"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Running:
    pgid: int
    command: str
    log_path: str
    port: int
    #: host files of this start (launch script, secrets) removed once the group is gone
    files: tuple[str, ...] = ()


class Server:
    """One SGLang server on `host`, restarted per trial.

    `endpoint` is the way the tuner reaches the server's port (default: the host's address).
    `api_key` authenticates the tuner's requests; SGLang logs its whole server_args at start-up,
    the key included, so everything read back from the server (reasons, log lines, the fetched
    log) is masked before it leaves this class, as are the secrets of every spec it started.
    `marker` (e.g. one per study and worker) goes into every started server's environment, so
    `stop_strays` finds servers whose group was never recorded; `runtime` may be a container
    or a Slurm step.
    `nvidia_smi` is the command used to read GPU facts and wait for memory release (skipped when
    the host has no such command). `keep_logs`: False when tuner chose where the logs go (they
    are removed once fetched, `server.logs`). `clock`/`sleep` are seams for tests.
    """

    reach_grace_s: float = REACH_GRACE_S  # the port listens, unreachable via the endpoint

    def __init__(
        self,
        host: Host,
        timeouts: Timeouts | None = None,
        *,
        endpoint: Endpoint | None = None,
        nvidia_smi: str | Sequence[str] = "nvidia-smi",
        api_key: str | None = None,
        marker: str | None = None,
        tail_lines: int = 40,
        runtime: Runtime | None = None,
        keep_logs: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.host = host
        self.timeouts = timeouts or Timeouts()
        self.endpoint = endpoint or DirectEndpoint(host.address)
        self.nvidia_smi = (nvidia_smi,) if isinstance(nvidia_smi, str) else tuple(nvidia_smi)
        self.api_key = api_key
        self.marker = marker
        self.tail_lines = tail_lines
        self.runtime = runtime or DirectRuntime(host)
        self.logs = HostLogs(host, keep_logs)
        self._clock = clock
        self._sleep = sleep
        self._running: _Running | None = None
        self._gpus: tuple[GpuInfo, ...] | None = None
        self._secrets: set[str] = {api_key} if api_key and len(api_key) >= MIN_MASKED_LEN else set()
        self._setup_ok: set[tuple[str | None, str | None]] = set()  # (program, cwd) checked
        self.on_poll: Callable[..., None] = lambda last=False: None  # server/startlog.py

    # -- public ----------------------------------------------------------------------------

    @property
    def pgid(self) -> int | None:
        """Process group of the server we started last (None when stopped)."""
        return self._running.pgid if self._running else None

    @property
    def log_path(self) -> str | None:
        return self._running.log_path if self._running else None

    def adopt(self, pgid: int, command: str, log_path: str, port: int) -> None:
        """Take over a server a previous tuner process started (e.g. a zombie trial's)."""
        self._running = _Running(pgid, command, log_path, port)

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: OnLaunch = None, *, follower: bool = False
    ) -> StartResult:
        """Stop the previous server, start `spec` logging to `log_path`, wait ready, verify.

        `on_launch(pgid)` runs as soon as the process group exists, before readiness, so a
        caller killed during a long start-up has already recorded what to stop.
        `follower`: a rank > 0 across nodes (server/nodes.py): its port (a dummy /health) is
        not checked nor awaited; "launched", its secrets kept until `drop_secrets`.
        Raises SetupError (the launch command or workdir is wrong), PortHeldError (someone
        else holds the port), InfraError (the host failed).
        """
        t0 = self._clock()
        stop_s = self.stop()
        self.logs.sweep()  # the runner fetched the gone servers' logs when each ended
        t1 = self._clock()
        self._check_setup(spec)
        self._prepare(spec, check_port=not follower)
        t2 = self._clock()
        self._secrets |= spec.secret_values()
        command, files = self._write_launch(spec, log_path)
        env = {MARKER_VAR: self.marker} if self.marker else None
        pgid = self.host.start_detached(
            command, log_path=log_path, cwd=spec.cwd, env=env, cleanup=files
        )
        self._running = _Running(pgid, command, log_path, spec.port, files)
        if on_launch is not None:
            on_launch(pgid)
        t3 = self._clock()
        if follower:
            timed = Timings(stop_s, t2 - t1, t3 - t2, total_s=t3 - t0)
            return StartResult(True, None, "launched", pgid=pgid, log_path=log_path, timings=timed)
        try:
            failed = self._wait_ready(spec)
        finally:
            remove(self.host, files[1:])  # SGLang read its --config at start: keep no secrets
        t4 = self._clock()
        if failed is not None:
            return self._result(failed, Timings(stop_s, t2 - t1, t3 - t2, t4 - t3, 0, t4 - t0))
        res = self._verify(spec)
        t5 = self._clock()
        timings = Timings(stop_s, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)
        return self._result(res, timings)

    def drop_secrets(self) -> None:
        """Remove the running server's secret flags' file (a follower's, once it started)."""
        if self._running is not None:
            remove(self.host, self._running.files[1:])

    def stop(self) -> float:
        """Stop our server's group (TERM, CONT, wait stop_s, KILL); returns the seconds it took.

        The record (`pgid`) is cleared only once the group is gone: when the host fails
        mid-stop (HostUnreachable, CommandTimeout) the error propagates and a later stop, or
        `stop_strays`, still finds the server.
        """
        t0 = self._clock()
        run = self._running
        if run is None:
            return 0.0
        leader = self.host.cmdline(run.pgid)
        if leader is None:  # the leader is gone; its children keep the pgid from being reused
            members = self.host.group_pids(run.pgid)
            if not members:
                self._forget(run)
                return self._clock() - t0
        else:
            # the GPU check needs every member (SGLang's scheduler children hold the memory)
            members = self.host.group_pids(run.pgid) if self.gpus() else [run.pgid]
            if run.command not in leader and not self._carries_marker(run.pgid):
                # the pid was reused by another process since: not ours to kill
                log.warning(
                    "%s: pgid %d now runs %r; not stopping it",
                    self.host.name,
                    run.pgid,
                    self._mask(leader[:100]),
                )
                self._forget(run)
                return self._clock() - t0
        self._kill_group(run.pgid)
        self._forget(run)
        self._wait_gpu_free(members)
        return self._clock() - t0

    def stop_strays(self) -> list[tuple[int, str]]:
        """Stop every server group carrying our marker (lost by an earlier, killed run, or
        ours); return (pgid, command) of each. Nothing without a marker."""
        if not self.marker:
            return []
        self._wait_gpu_free(self.runtime.stop_strays(self.gpus))  # containers, by label
        found = self.host.marked_groups(MARKER_VAR, self.marker)
        for pgid, command in found:
            log.warning(
                "%s: stopping server group %d left by an earlier run: %s",
                self.host.name,
                pgid,
                self._mask(command[:160]),
            )
            members = self.host.group_pids(pgid) if self.gpus() else []
            self._kill_group(pgid)
            if self._running is not None and self._running.pgid == pgid:
                self._forget(self._running)
            self._wait_gpu_free(members)
        return [(pgid, self._mask(command)) for pgid, command in found]

    def responsive(self, timeout_s: float) -> bool:
        """True when our server answers GET /health with 200 within `timeout_s` (a hung server,
        alive but stopped, gives False after about `timeout_s`)."""
        if self._running is None:
            return False
        return self._http_status("/health", timeout_s) == 200

    def check(self) -> ServerDeath | None:
        """None while the server runs; else why it died (e.g. oom_runtime under load)."""
        if self._running is None or self.host.group_alive(self._running.pgid):
            return None
        code, tail = self._exit_and_tail(self._running.log_path)
        cls, reason = explain_failure(code, tail)
        return ServerDeath(cls, self._mask(reason), tuple(self._mask(x) for x in tail), code)

    def fetch_log(self, local_path: str) -> bool:
        """Copy the current (or the last gone) server's log to `local_path`, secrets masked;
        False without one."""
        remote = self._running.log_path if self._running else self.logs.last
        if remote is None:
            return False
        self.host.fetch(remote, local_path)
        if self._secrets:
            path = Path(local_path)
            path.write_text(self._mask(path.read_text(errors="replace")))
        return True

    def gpus(self) -> tuple[GpuInfo, ...]:
        """GPU model and memory from nvidia-smi (empty without nvidia-smi); read once."""
        if self._gpus is None:
            found = not self.runtime.remote and self.host.which(self.nvidia_smi[0])
            self._gpus = gpu_list(self.host, self.nvidia_smi) if found else ()
        return self._gpus

    def gpu_memory(self) -> GpuMemory | None:
        """What the host's GPUs hold now (server/gpus.py; None without nvidia-smi)."""
        return memory_in_use(self.host, self.nvidia_smi) if self.gpus() else None

    # -- steps ------------------------------------------------------------------------------

    def _check_setup(self, spec: LaunchSpec) -> None:
        """Once per (program, workdir): the workdir exists and the launch program can run."""
        key = (launch_program(spec.argv), spec.cwd)
        if key not in self._setup_ok:
            self.runtime.check_setup(spec)
            self._setup_ok.add(key)

    def _prepare(self, spec: LaunchSpec, check_port: bool = True) -> None:
        """Port free (our strays stopped; PortHeldError naming the holder otherwise), GPU facts;
        a Slurm step's port is the node's, a follower rank's rank 0's business."""
        port_free = lambda: self.host.port_free(spec.port)  # noqa: E731
        if check_port and not self.runtime.remote and not port_free():
            self.stop_strays()
            if not self._poll(port_free, self.timeouts.port_free_s):
                raise port_held_error(self.host, spec.port, self._mask)
        self.gpus()  # the start_detached script creates the log's directory

    def _write_launch(self, spec: LaunchSpec, log_path: str) -> tuple[str, tuple[str, ...]]:
        """Write the launch script (and the secret flags' --config file) next to the log on
        the host, through stdin; return the command that runs it and the files written."""
        script = log_path + SCRIPT_SUFFIX
        files = [script]
        config = None
        if spec.secret_flags:
            config = log_path + SECRETS_SUFFIX
            self.host.write_file(config, spec.secrets_yaml(), 0o600)
            files.append(config)
        spec = self.runtime.wrap(spec, config)  # in a container: `docker run ... IMAGE argv`
        self.host.write_file(script, spec.script(config), 0o700)
        return f"bash {shlex.quote(script)}", tuple(files)

    def _forget(self, run: _Running) -> None:
        """The group is gone: drop its record and its files, mask the secrets in its log
        (SGLang logs its server_args, the API key included); a container first, by name."""
        self._wait_gpu_free(self.runtime.remove(self.gpus))
        if self._running is run:
            self._running = None
        remove(self.host, run.files)
        self.logs.gone(run.log_path)
        if self._secrets and run.log_path:
            text = "\n".join(sorted(self._secrets, key=len, reverse=True)) + "\n"
            try:
                self.host.run_shell(mask_file_script(run.log_path, REDACTED), stdin=text.encode())
            except InfraError as exc:  # the log stays 0600; masking is the second line
                log.warning("%s: cannot mask %s: %s", self.host.name, run.log_path, exc)

    def _carries_marker(self, pgid: int) -> bool:
        if not self.marker:
            return False
        return pgid in dict(self.host.marked_groups(MARKER_VAR, self.marker))

    def _wait_ready(self, spec: LaunchSpec) -> StartResult | None:
        """None once /health says 200; a failure when the group died or the deadline passed.
        SetupError when the death shows the launch command itself cannot run."""
        run = self._running
        assert run is not None
        deadline = self._clock() + self.timeouts.ready_s
        grace, remote = self.reach_grace_s, self.runtime.remote  # remote: the port is the node's
        reach = ReachWatch(self.endpoint, self.host, run.port, grace, self._clock, remote=remote)
        waits = self.timeouts.poll_waits()
        while True:
            self.on_poll()
            status = self._http_status("/health")
            alive = status == 200 or self.host.group_alive(run.pgid)
            if status == 200 or not alive:  # the start ended: its log's last milestones
                self.on_poll(last=True)
            if status == 200:
                return None
            if not alive:
                code, tail = self._exit_and_tail(run.log_path)
                setup = self.runtime.setup_error(code, tail, self._mask)  # before _forget
                self._forget(run)
                setup = setup or setup_error(self.host.name, spec, code, tail, self._mask)
                if setup is not None:
                    self._setup_ok.clear()
                    raise setup
                cls, reason = explain_failure(code, tail)
                return StartResult(False, cls, reason, tuple(tail), run.pgid, code, run.log_path)
            reach.check(status)  # a way to the port that fails is the world's: raise
            if self._clock() > deadline:
                self._kill_group(run.pgid)  # raises (record kept) if the group survives
                self._forget(run)
                _, tail = self._exit_and_tail(run.log_path)
                why = (
                    f"not ready within {self.timeouts.ready_s:g} s (GET /health never answered 200)"
                )
                cls = FailureClass.TIMEOUT
                return StartResult(
                    False, cls, why + "; killed", tuple(tail), run.pgid, None, run.log_path
                )
            self._sleep(next(waits))

    def _verify(self, spec: LaunchSpec) -> StartResult:
        """Confirm the answering server is ours and resolved what we asked; record its facts."""
        run = self._running
        assert run is not None
        info = self._server_info()
        base = {"pgid": run.pgid, "log_path": run.log_path}
        if info is None:
            return StartResult(
                False,
                FailureClass.CRASHED,
                "ready, but /get_server_info and /server_info failed",
                **base,
            )
        pid = info.get("pid")
        # the answer came from a live server: whose? SGLang reports no pid, so the port's
        # listener tells (a container's pids are its own: not comparable)
        pids = [pid] if isinstance(pid, int) else []
        if not pids and self.runtime.host_pids:
            pids = [p for p, _ in self.host.port_holders(spec.port)]
        known = bool(pids) and self.runtime.host_pids
        members = self.host.group_pids(run.pgid) if known else [run.pgid]
        if not members:  # ours died between /health and now: a death, not a stale server
            code, tail = self._exit_and_tail(run.log_path)  # before a container is removed
            self._forget(run)
            cls, reason = explain_failure(code, tail)
            return StartResult(False, cls, reason, tuple(tail), run.pgid, code, run.log_path)
        if known and not set(pids) & set(members):
            self._kill_group(run.pgid)
            self._forget(run)
            return StartResult(
                False,
                FailureClass.STALE_SERVER,
                f"pid {pids[0]} answering on port {spec.port} is not the one we started "
                f"(pgid {run.pgid})",
                **base,
            )
        facts = {
            "max_total_num_tokens": as_int(internal(info, "max_total_num_tokens")),
            "mem_fraction_static": as_float(info.get("mem_fraction_static")),
            "max_running_requests": as_int(internal(info, "max_running_requests")),
            "version": str(info["version"]) if info.get("version") is not None else None,
            "server_pid": pid if isinstance(pid, int) else None,
        }
        wrong = mismatches({**spec.flags, "port": spec.port}, info)
        if wrong:
            return StartResult(False, FailureClass.ARGS_MISMATCH, "; ".join(wrong), **base, **facts)
        return StartResult(True, None, "ready", **base, **facts)

    # -- helpers ----------------------------------------------------------------------------

    def _result(self, res: StartResult, timings: Timings) -> StartResult:
        return replace(
            res,
            reason=self._mask(res.reason),
            evidence=tuple(self._mask(x) for x in res.evidence),
            timings=timings,
            gpus=self._gpus or (),
        )

    def _mask(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def _poll(self, ok: Callable[[], bool], limit_s: float) -> bool:
        deadline = self._clock() + limit_s
        waits = self.timeouts.poll_waits()
        while True:
            if ok():
                return True
            if self._clock() > deadline:
                return False
            self._sleep(next(waits))

    def _kill_group(self, pgid: int) -> None:
        """TERM the group, wait stop_s, then KILL; InfraError if it still lives.

        CONT after TERM: a stopped (SIGSTOPped, hung) process gets TERM only once continued.
        """
        self.host.signal_group(pgid, "TERM")
        self.host.signal_group(pgid, "CONT")
        if self._poll(lambda: not self.host.group_alive(pgid), self.timeouts.stop_s):
            return
        log.warning(
            "%s: group %d ignored TERM for %g s; killing",
            self.host.name,
            pgid,
            self.timeouts.stop_s,
        )
        self.host.signal_group(pgid, "KILL")
        if not self._poll(lambda: not self.host.group_alive(pgid), max(5.0, self.timeouts.poll_s)):
            raise InfraError(f"{self.host.name}: process group {pgid} survived SIGKILL")

    def _wait_gpu_free(self, pids: Sequence[int]) -> None:
        """Where nvidia-smi exists, wait until none of the old server's pids holds GPU memory."""
        if not pids or not self.gpus():
            return
        old = {str(p) for p in pids}

        def released() -> bool:
            res = self.host.run(
                [*self.nvidia_smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"]
            )
            return res.ok and not (old & {ln.strip() for ln in res.stdout.splitlines()})

        if not self._poll(released, self.timeouts.gpu_free_s):
            raise InfraError(
                f"{self.host.name}: GPU memory of the stopped server not released after "
                f"{self.timeouts.gpu_free_s:g} s (nvidia-smi --query-compute-apps)"
            )

    def _exit_and_tail(self, log_path: str) -> tuple[int | None, list[str]]:
        code, lines = self.runtime.exit_and_tail(log_path, EVIDENCE_SCAN_LINES)
        return code, evidence_tail(lines, self.tail_lines)

    def _url(self, path: str) -> str:
        assert self._running is not None
        return self.endpoint.url(self._running.port) + path

    def _http_status(self, path: str, timeout_s: float | None = None) -> int | None:
        limit = self.timeouts.http_s if timeout_s is None else timeout_s
        return http_status(self._url(path), self.api_key, limit)

    def _server_info(self) -> dict[str, Any] | None:
        return server_info(self._url(""), self.api_key, self.timeouts.http_s)
