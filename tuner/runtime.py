"""Builds the real seams of a study from its config: host, server, load runner, scorer, hardware.

This is the only place where the study file's sections meet the I/O modules' option types, so
the mapping (YAML key -> dataclass field) lives here once.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.capacity import kv_layout
from tuner.config import StudyConfig, TargetSection
from tuner.errors import ConfigError
from tuner.hosts.local import LocalHost
from tuner.hosts.ssh import SSHHost, SSHOptions
from tuner.launch import REDACTED, LaunchSpec
from tuner.loadgen import LoadOptions, LoadResult, run_load_sync
from tuner.metrics import goodput
from tuner.modelcfg import load_model_config
from tuner.precheck import Hardware
from tuner.lifecycle import Server, ServerTimeouts, StartResult
from tuner.workload import Request, WorkloadSpec, build_requests

#: requests built for a duration-bounded run when the study file gives no count (at least this
#: many, and 20 per slot of the highest concurrency searched, so a run does not run dry)
DEFAULT_POOL = 2000
STUDY_MAX_LOOP_LAG_MS = 250.0


def is_local(target: TargetSection) -> bool:
    """Only the keyword `local` runs without SSH: `127.0.0.1` means SSH to this machine."""
    return target.host == "local"


def build_host(target: TargetSection) -> LocalHost | SSHHost:
    """LocalHost for `host: local`, else SSHHost with the study file's SSH options."""
    if is_local(target):
        return LocalHost(command_timeout_s=target.ssh.command_timeout_s)
    s = target.ssh
    return SSHHost(
        SSHOptions(
            host=target.host, user=s.user, port=s.port, identity_file=s.identity_file,
            known_hosts=s.known_hosts, trust_unknown_host_key=s.trust_unknown_host_key,
            ssh_config=s.ssh_config if s.ssh_config is not None else "~/.ssh/config",
            password_env=s.password_env, use_agent=s.use_agent, look_for_keys=s.look_for_keys,
            connect_timeout_s=s.connect_timeout_s,
            banner_timeout_s=s.banner_timeout_s, auth_timeout_s=s.auth_timeout_s,
            channel_timeout_s=s.channel_timeout_s,
            command_timeout_s=s.command_timeout_s, reconnect_attempts=s.reconnect_attempts,
        )
    )  # fmt: skip


def http_host(target: TargetSection) -> str:
    if target.http_host:
        return target.http_host
    return "127.0.0.1" if is_local(target) else target.host


def base_url(target: TargetSection) -> str:
    return f"http://{http_host(target)}:{target.port}"


def secret(name: str | None, key: str) -> str | None:
    """A secret read from the environment variable the study file names (never from the file)."""
    if not name:
        return None
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set", key=key)
    return value


def workload_spec(cfg: StudyConfig) -> WorkloadSpec:
    w = cfg.workload
    top = cfg.space.get("concurrency")
    pool = max(DEFAULT_POOL, 20 * int(top.high or 0)) if top and top.high else DEFAULT_POOL
    return WorkloadSpec(
        kind=w.kind, num_requests=w.num_requests or pool, seed=w.seed, input_len=w.input_len,
        output_len=w.output_len, range_ratio=w.range_ratio, num_groups=w.num_groups,
        prompts_per_group=w.prompts_per_group, prefix_len=w.prefix_len,
        question_len=w.question_len, turns=w.turns, dataset_path=w.dataset,
    )  # fmt: skip


def load_options(cfg: StudyConfig, concurrency: int, api_key: str | None) -> LoadOptions:
    w = cfg.workload
    return LoadOptions(
        backend=w.backend, concurrency=concurrency,
        request_rate=w.request_rate if w.request_rate else math.inf,
        duration_s=w.duration_s, num_requests=w.num_requests, warmup_requests=w.warmup_requests,
        flush_cache=w.flush_cache, request_timeout_s=w.request_timeout_s,
        error_budget=w.max_error_rate, seed=w.seed, api_key=api_key,
        # a trial is discarded when the client lags; 50 ms p99 flags healthy runs on a shared
        # 2-core machine, while a client that is really the bottleneck lags by far more
        max_loop_lag_ms=STUDY_MAX_LOOP_LAG_MS,
    )  # fmt: skip


def load_runner(
    cfg: StudyConfig, requests: list[Request], api_key: str | None
) -> Callable[[str, int], LoadResult]:
    """(base_url, concurrency) -> LoadResult, with the study's one fixed request list."""

    def run(url: str, concurrency: int) -> LoadResult:
        return run_load_sync(url, requests, load_options(cfg, concurrency, api_key))

    return run


def scorer(cfg: StudyConfig) -> Callable[[LoadResult], dict[str, Any]]:
    """LoadResult -> metrics JSON: bench_serving's keys, goodput under the SLOs, the server's view."""
    slo = cfg.objective.slo

    def score(result: LoadResult) -> dict[str, Any]:
        out = result.summary()
        out["goodput"] = goodput(
            result.records, result.duration_s, ttft_ms=slo.p99_ttft_ms, tpot_ms=slo.p99_tpot_ms,
            e2e_ms=slo.p99_e2e_latency_ms,
        )  # fmt: skip
        return out

    return score


def hardware(cfg: StudyConfig) -> Hardware:
    """The pre-check's facts: bytes per token from the model config, GPU memory, host RAM."""
    hw = cfg.hardware
    bpt = None
    if hw.model_config_path:
        tp = int(cfg.server.get("tensor-parallel-size") or cfg.server.get("tp-size") or 1)
        kv_dtype = str(cfg.server.get("kv-cache-dtype", "auto"))
        if kv_dtype == "bfloat16":
            kv_dtype = "bf16"
        bpt = kv_layout(load_model_config(hw.model_config_path), tp, kv_dtype).bytes_per_token
    return Hardware(bytes_per_token=bpt, gpu_mem_mib=hw.gpu_mem_mib, host_ram_gb=hw.host_ram_gb)


def requests_for(cfg: StudyConfig) -> list[Request]:
    return build_requests(workload_spec(cfg))


@dataclass(frozen=True)
class Started:
    """server.StartResult in the objective's terms (an info mapping, a failure class)."""

    ok: bool
    failure: str | None
    reason: str
    info: dict[str, Any]
    pgid: int | None


class ServerSeam:
    """Adapts server.Server to objective.ServerLike: the trial sees flags in, facts out."""

    def __init__(self, server: Server, secrets: Sequence[str] = ()):
        self.server = server
        self.last: StartResult | None = None
        # SGLang logs its whole server_args at start-up, --api-key included: everything read
        # back from the server is masked before it reaches a trial's records
        self.secrets = [x for x in secrets if x]

    def _mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> Started:
        r = self.server.restart(spec, log_path, on_launch)
        self.last = r
        info: dict[str, Any] = {
            "max_total_num_tokens": r.max_total_num_tokens, "mem_fraction_static": r.mem_fraction_static,
            "max_running_requests": r.max_running_requests, "version": r.version,
            "restart_s": round(r.timings.total_s, 3), "overhead_s": round(r.timings.overhead_s, 3),
        }  # fmt: skip
        if r.gpus:
            info["gpu"] = f"{len(r.gpus)} x {r.gpus[0].name} ({r.gpus[0].memory_total_mib} MiB)"
        if not r.ok:
            info["evidence"] = [self._mask(line) for line in r.evidence[-8:]]
        return Started(
            r.ok, r.failure, self._mask(r.reason),
            {k: v for k, v in info.items() if v is not None}, r.pgid,
        )  # fmt: skip

    def check(self) -> str | None:
        death = self.server.check()
        return None if death is None else death.failure

    def stop(self) -> None:
        self.server.stop()

    def fetch_log(self, local_path: str) -> None:
        if self.server.fetch_log(local_path) and self.secrets:
            path = Path(local_path)
            path.write_text(self._mask(path.read_text(errors="replace")))


def server_timeouts(target: TargetSection) -> ServerTimeouts:
    t = target.timeouts
    return ServerTimeouts(
        ready_s=t.ready_s, stop_s=t.stop_s, port_free_s=t.port_free_s, gpu_free_s=t.gpu_free_s,
        poll_s=t.poll_s, http_s=t.http_s,
    )  # fmt: skip


def launch_env(target: TargetSection) -> dict[str, str]:
    env = dict(target.env)
    if target.gpus:
        env["CUDA_VISIBLE_DEVICES"] = target.gpus
    return env


def launch_template(target: TargetSection) -> list[str]:
    """The launch argv prefix; `{python}` stands for the Python running tuner (simulator studies)."""
    return [sys.executable if a == "{python}" else a for a in target.launch]


def launch_marker(target: TargetSection) -> str:
    """A secret-free part of the server's command line, to recognise it after a PID reuse check."""
    return " ".join(a for a in launch_template(target) if not a.startswith("{"))


def trial_line(cfg: StudyConfig, trial: Any) -> str:
    """One progress line per finished trial."""
    a = trial.user_attrs
    params = " ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items()
    )
    status = a.get("status") or trial.state.name.lower()
    m = a.get("metrics") or {}
    if status in ("ok", "slo_missed") and m and trial.values:
        what = f"{trial.values[0]:,.1f} {cfg.objective.metric}, p99 TTFT {m.get('p99_ttft_ms', 0):,.0f} ms"
        if status == "slo_missed":
            what += f" ({a.get('reason', '')})"
    else:
        what = a.get("reason") or a.get("infra_error") or ""
    tags = " [restart]" if a.get("restarted") else ""
    if "duplicate_of" in a:
        tags = f" [= trial {a['duplicate_of']}]"
    return f"trial {trial.number:>3} {status:<12} {params}: {what}{tags}"
