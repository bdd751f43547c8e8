"""The SGLang server's lifecycle on a Host: stop the old one, start, wait ready, verify, classify.

`Server(host, timeouts).restart(spec, log_path)` returns a `StartResult`: either a verified
running server (with what it resolved: KV pool size, mfs, ...) or a classified failure with the
log lines that show why. A failure caused by the flags is a result, not an exception; only the
infrastructure (host unreachable, a group that will not die) raises InfraError.

The old server is stopped by its process group, never by name, and only after checking that the
group's leader still runs what we started (PID reuse). Readiness is GET /health == 200; an early
death is noticed at the next poll (the group is gone) instead of waiting out the deadline.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.config import Timeouts
from tuner.errors import InfraError
from tuner.hosts.base import EXIT_SUFFIX, Host
from tuner.launch import REDACTED, LaunchSpec
from tuner.server_info import as_float, as_int, internal, mismatches
from tuner.sglang.failures import FailureClass, explain_failure

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi names it."""

    name: str
    memory_total_mib: int


@dataclass(frozen=True)
class Timings:
    """Where a restart's time went (seconds); overhead_s is everything but the server's start-up."""

    stop_s: float = 0.0
    prepare_s: float = 0.0
    launch_s: float = 0.0
    start_to_ready_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.start_to_ready_s


@dataclass(frozen=True)
class StartResult:
    """The outcome of one restart."""

    ok: bool
    failure: str | None
    reason: str
    evidence: tuple[str, ...] = ()
    pgid: int | None = None
    exit_code: int | None = None
    log_path: str = ""
    max_total_num_tokens: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    version: str | None = None
    server_pid: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    timings: Timings = field(default_factory=Timings)

    def facts(self) -> dict[str, Any]:
        """What a trial records of this start: the server's resolved values, where the time
        went, the GPU, and for a failure the log lines that show why (None values dropped)."""
        info: dict[str, Any] = {
            "max_total_num_tokens": self.max_total_num_tokens,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests,
            "version": self.version,
            "restart_s": round(self.timings.total_s, 3),
            "overhead_s": round(self.timings.overhead_s, 3),
        }
        if self.gpus:
            gpu = self.gpus[0]
            info["gpu"] = f"{len(self.gpus)} x {gpu.name} ({gpu.memory_total_mib} MiB)"
        if not self.ok:
            info["evidence"] = list(self.evidence[-8:])
        return {k: v for k, v in info.items() if v is not None}


@dataclass(frozen=True)
class ServerDeath:
    """A server that was running and is gone: why, and the log lines that say so."""

    failure: str
    reason: str
    evidence: tuple[str, ...]
    exit_code: int | None


@dataclass(frozen=True)
class _Running:
    pgid: int
    command: str
    log_path: str
    port: int


class Server:
    """One SGLang server on `host`, restarted per trial.

    `http_host` is where the tuner reaches the server's port (default: the host's address).
    `api_key` authenticates the tuner's requests; SGLang logs its whole server_args at start-up,
    the key included, so everything read back from the server (reasons, log lines, the fetched
    log) is masked before it leaves this class.
    `nvidia_smi` is the command used to read GPU facts and wait for memory release (skipped when
    the host has no such command). `clock`/`sleep` are seams for tests.
    """

    def __init__(
        self,
        host: Host,
        timeouts: Timeouts | None = None,
        *,
        http_host: str | None = None,
        nvidia_smi: str = "nvidia-smi",
        api_key: str | None = None,
        tail_lines: int = 40,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.host = host
        self.timeouts = timeouts or Timeouts()
        self.http_host = http_host or host.address
        self.nvidia_smi = nvidia_smi
        self.api_key = api_key
        self.tail_lines = tail_lines
        self._clock = clock
        self._sleep = sleep
        self._running: _Running | None = None
        self._gpus: tuple[GpuInfo, ...] | None = None

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
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResult:
        """Stop the previous server, start `spec` logging to `log_path`, wait ready, verify.

        `on_launch(pgid)` runs as soon as the process group exists, before readiness, so a
        caller killed during a long start-up has already recorded what to stop.
        """
        t0 = self._clock()
        stop_s = self.stop()
        t1 = self._clock()
        blocked = self._prepare(spec, log_path)
        t2 = self._clock()
        if blocked is not None:
            return self._result(blocked, Timings(stop_s, t2 - t1, total_s=t2 - t0))
        command = spec.shell_command()
        pgid = self.host.start_detached(command, log_path=log_path, cwd=spec.cwd)
        self._running = _Running(pgid, command, log_path, spec.port)
        if on_launch is not None:
            on_launch(pgid)
        t3 = self._clock()
        failed = self._wait_ready()
        t4 = self._clock()
        if failed is not None:
            return self._result(failed, Timings(stop_s, t2 - t1, t3 - t2, t4 - t3, 0, t4 - t0))
        res = self._verify(spec)
        t5 = self._clock()
        timings = Timings(stop_s, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)
        return self._result(res, timings)

    def stop(self) -> float:
        """Stop our server's group (TERM, wait stop_s, KILL); returns the seconds it took."""
        t0 = self._clock()
        run, self._running = self._running, None
        if run is None:
            return 0.0
        leader = self.host.cmdline(run.pgid)
        if leader is None:  # the leader is gone; its children keep the pgid from being reused
            members = self.host.group_pids(run.pgid)
            if not members:
                return self._clock() - t0
        else:
            # the GPU check needs every member (SGLang's scheduler children hold the memory)
            members = self.host.group_pids(run.pgid) if self.gpus() else [run.pgid]
            if run.command not in leader:
                # the pid was reused by another process since: not ours to kill
                log.warning(
                    "%s: pgid %d now runs %r; not stopping it",
                    self.host.name,
                    run.pgid,
                    leader[:100],
                )
                return self._clock() - t0
        self._kill_group(run.pgid)
        self._wait_gpu_free(members)
        return self._clock() - t0

    def check(self) -> ServerDeath | None:
        """None while the server runs; else why it died (e.g. oom_runtime under load)."""
        if self._running is None or self.host.group_alive(self._running.pgid):
            return None
        code, tail = self._exit_and_tail(self._running.log_path)
        cls, reason = explain_failure(code, tail)
        return ServerDeath(cls, self._mask(reason), tuple(self._mask(x) for x in tail), code)

    def fetch_log(self, local_path: str) -> bool:
        """Copy the current server's log to `local_path`; False when there is none."""
        if self._running is None:
            return False
        self.host.fetch(self._running.log_path, local_path)
        if self.api_key:
            path = Path(local_path)
            path.write_text(self._mask(path.read_text(errors="replace")))
        return True

    def gpus(self) -> tuple[GpuInfo, ...]:
        """GPU model and memory from nvidia-smi (empty without nvidia-smi); read once."""
        if self._gpus is None:
            self._gpus = ()
            if self.host.which(self.nvidia_smi):
                res = self.host.run(
                    [
                        self.nvidia_smi,
                        "--query-gpu=name,memory.total",
                        "--format=csv,noheader,nounits",
                    ]
                )
                self._gpus = (
                    tuple(
                        GpuInfo(name.strip(), int(float(mem)))
                        for name, _, mem in (ln.rpartition(",") for ln in res.stdout.splitlines())
                        if name.strip()
                    )
                    if res.ok
                    else ()
                )
        return self._gpus

    # -- steps ------------------------------------------------------------------------------

    def _prepare(self, spec: LaunchSpec, log_path: str) -> StartResult | None:
        """Port free, GPU facts, log directory; a StartResult when the start must not happen."""
        if not self._poll(lambda: self.host.port_free(spec.port), self.timeouts.port_free_s):
            return StartResult(
                False,
                FailureClass.PORT_IN_USE,
                f"{self.host.name}: port {spec.port} still in use after {self.timeouts.port_free_s:g} s "
                "by a process we did not start",
                log_path=log_path,
            )
        self.gpus()  # the start_detached script creates the log's directory
        return None

    def _wait_ready(self) -> StartResult | None:
        """None once /health says 200; a failure when the group died or the deadline passed."""
        run = self._running
        assert run is not None
        deadline = self._clock() + self.timeouts.ready_s
        while True:
            if self._http_status("/health") == 200:
                return None
            if not self.host.group_alive(run.pgid):
                code, tail = self._exit_and_tail(run.log_path)
                cls, reason = explain_failure(code, tail)
                self._running = None
                return StartResult(False, cls, reason, tuple(tail), run.pgid, code, run.log_path)
            if self._clock() > deadline:
                self._kill_group(run.pgid)
                self._running = None
                _, tail = self._exit_and_tail(run.log_path)
                return StartResult(
                    False,
                    FailureClass.TIMEOUT,
                    f"not ready within {self.timeouts.ready_s:g} s (GET /health never answered 200); killed",
                    tuple(tail),
                    run.pgid,
                    None,
                    run.log_path,
                )
            self._sleep(self.timeouts.poll_s)

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
        # the answer came from a live server; only a reported pid lets us tell whose it is
        members = self.host.group_pids(run.pgid) if isinstance(pid, int) else [run.pgid]
        if not members:  # ours died between /health and now: a death, not a stale server
            self._running = None
            code, tail = self._exit_and_tail(run.log_path)
            cls, reason = explain_failure(code, tail)
            return StartResult(False, cls, reason, tuple(tail), run.pgid, code, run.log_path)
        if isinstance(pid, int) and pid not in members:
            self._kill_group(run.pgid)
            self._running = None
            return StartResult(
                False,
                FailureClass.STALE_SERVER,
                f"pid {pid} answering on port {spec.port} is not the one we started (pgid {run.pgid})",
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
        return text.replace(self.api_key, REDACTED) if self.api_key else text

    def _poll(self, ok: Callable[[], bool], limit_s: float) -> bool:
        deadline = self._clock() + limit_s
        while True:
            if ok():
                return True
            if self._clock() > deadline:
                return False
            self._sleep(self.timeouts.poll_s)

    def _kill_group(self, pgid: int) -> None:
        """TERM the group, wait stop_s, then KILL; InfraError if it still lives."""
        self.host.signal_group(pgid, "TERM")
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
        if not self.gpus():
            return
        old = {str(p) for p in pids}

        def released() -> bool:
            res = self.host.run(
                [self.nvidia_smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"]
            )
            return res.ok and not (old & {ln.strip() for ln in res.stdout.splitlines()})

        if not self._poll(released, self.timeouts.gpu_free_s):
            raise InfraError(
                f"{self.host.name}: GPU memory of the stopped server not released after "
                f"{self.timeouts.gpu_free_s:g} s (nvidia-smi --query-compute-apps)"
            )

    def _exit_and_tail(self, log_path: str) -> tuple[int | None, list[str]]:
        status = self.host.read_tail(log_path + EXIT_SUFFIX, 1)
        code = int(status[0]) if status and status[0].strip().lstrip("-").isdigit() else None
        return code, self.host.read_tail(log_path, self.tail_lines)

    def _url(self, path: str) -> str:
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        assert self._running is not None
        return f"http://{host}:{self._running.port}{path}"

    def _request(self, path: str) -> urllib.request.Request:
        req = urllib.request.Request(self._url(path))
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        return req

    def _http_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self._request(path), timeout=self.timeouts.http_s) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):  # refused, reset, timed out: not up (yet)
            return None

    def _server_info(self) -> dict[str, Any] | None:
        for path in ("/get_server_info", "/server_info"):
            try:
                with urllib.request.urlopen(self._request(path), timeout=self.timeouts.http_s) as r:
                    data = json.loads(r.read())
                if isinstance(data, dict):
                    return data
            except (OSError, ValueError):
                continue
        return None
