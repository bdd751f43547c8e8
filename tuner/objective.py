"""One trial end to end: pre-check -> (re)start or reuse -> load -> score -> constraints.

No optuna here: `run_trial` returns a `TrialOutcome` and study.py maps it to a trial state.
The server and the load run are seams (constructor arguments), so tests drive this with the
simulator or with scripted fakes.

Every completed trial carries the same constraint keys (GPSampler requires it): a value <= 0 is
feasible. `c_start` is 1 when the server could not run the config (pre-check rejection, failed
start, death under load); the latency ones are observed/limit - 1, or -1 when no limit is set.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.config import StudyConfig
from tuner.errors import ConfigError
from tuner.launch import LaunchSpec, build_launch, redact_argv
from tuner.precheck import Hardware, Knowledge, precheck
from tuner.space import canonical, client_params, server_flags

CONSTRAINT_KEYS = ("c_start", "c_ttft", "c_tpot", "c_itl", "c_e2e", "c_errors")
SLO_METRICS = {  # constraint key -> (slo field, metrics JSON key)
    "c_ttft": ("p99_ttft_ms", "p99_ttft_ms"),
    "c_tpot": ("p99_tpot_ms", "p99_tpot_ms"),
    "c_itl": ("p99_itl_ms", "p99_itl_ms"),
    "c_e2e": ("p99_e2e_latency_ms", "p99_e2e_latency_ms"),
}
#: objective value of a configuration that did not run: worse than anything measured
PESSIMISTIC_LATENCY_MS = 1e7
#: after a run stopped by errors, how long to watch for the server's death before blaming errors
DEATH_GRACE_S = 5.0


class StartResultLike(Protocol):
    ok: bool
    failure: str | None
    reason: str
    info: Mapping[str, Any]
    pgid: int | None


class ServerLike(Protocol):
    """What a trial needs of the server lifecycle (server.Server satisfies it)."""

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResultLike: ...
    def check(self) -> str | None: ...  # None while alive, else the failure class
    def stop(self) -> None: ...
    def fetch_log(self, local_path: str) -> None: ...


class LoadResultLike(Protocol):
    records: Sequence[Any]
    duration_s: float
    stopped: str

    @property
    def flagged(self) -> bool: ...


LoadRunner = Callable[[str, int], LoadResultLike]  # (base_url, concurrency) -> result
Scorer = Callable[[LoadResultLike], dict[str, Any]]  # result -> metrics JSON (bench_serving keys)


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial measured or why it could not; study.py turns it into optuna state."""

    status: str  # ok | slo_missed | rejected | start_failed | died | flagged
    values: tuple[float, ...]
    constraints: Mapping[str, float]
    reason: str = ""
    failure: str | None = None  # server failure class (oom_cuda_graph, host_memory, ...)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    server_info: Mapping[str, Any] = field(default_factory=dict)
    restarted: bool = False
    launched: bool = False
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())

    def attrs(self) -> dict[str, Any]:
        """JSON-safe user attributes for the optuna trial."""
        d = asdict(self)
        d["values"] = list(self.values)
        return json.loads(json.dumps(d, default=str))


def slo_constraints(cfg: StudyConfig, metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {"c_start": -1.0}
    slo = cfg.objective.slo
    for key, (slo_field, metric_key) in SLO_METRICS.items():
        limit = getattr(slo, slo_field)
        out[key] = -1.0 if limit is None else float(metrics.get(metric_key, 0.0)) / limit - 1.0
    rate = float(metrics.get("error_rate", 0.0))
    out["c_errors"] = rate - slo.max_error_rate if rate > slo.max_error_rate else -1.0
    return out


def objective_values(cfg: StudyConfig, metrics: Mapping[str, Any]) -> tuple[float, ...]:
    """The study's objective(s) from one run's metrics.

    A duration-bounded run cuts the requests still in flight at its end; counting only completed
    requests would score long requests at high concurrency as zero, so the window figure (all
    tokens received in the window / duration) is the score where the load run reports it.
    """
    metric = cfg.objective.metric
    main = float(metrics.get(f"window_{metric}", metrics.get(metric, 0.0)))
    if cfg.objective.pareto_latency:
        return (main, float(metrics.get(cfg.objective.pareto_latency, PESSIMISTIC_LATENCY_MS)))
    return (main,)


def failed_outcome(
    cfg: StudyConfig, status: str, reason: str, failure: str | None, **kw: Any
) -> TrialOutcome:
    """A configuration that could not run: pessimistic value, start constraint violated."""
    values: tuple[float, ...] = (0.0,)
    if cfg.objective.pareto_latency:
        values = (0.0, PESSIMISTIC_LATENCY_MS)
    constraints = dict.fromkeys(CONSTRAINT_KEYS, 1.0)
    return TrialOutcome(status, values, constraints, reason, failure, **kw)


#: flags SGLang dropped or renamed (sglang-reference.md section 9), with what to use instead
VERSION_HINTS = {
    "--cuda-graph-max-bs": "SGLang 0.5.23 split it into --cuda-graph-max-bs-decode and "
    "--cuda-graph-max-bs-prefill",
    "--cuda-graph-bs": "SGLang 0.5.23 split it into --cuda-graph-bs-decode and --cuda-graph-bs-prefill",
    "--stream-output": "gone in SGLang 0.5.23",
    "--enable-piecewise-cuda-graph": "gone in SGLang 0.5.23",
    "--enable-hicache": "new in SGLang 0.5.23; older versions call it --enable-hierarchical-cache",
    "--hicache-host-memory-fraction": "new in SGLang 0.5.23",
    "--hicache-host-memory-mode": "new in SGLang 0.5.23",
}


def _rejected_flags(cfg: StudyConfig, result: StartResultLike) -> ConfigError:
    """The server's argument parser refused the command line: every trial would fail the same
    way (e.g. a flag this SGLang version lacks), so the study stops instead of burning a night."""
    evidence = [str(x) for x in result.info.get("evidence", []) if str(x).strip()]
    said = next((x for x in reversed(evidence) if "error" in x.lower()), result.reason).strip()
    hints = [
        f"{flag}: {hint}"
        for flag, hint in VERSION_HINTS.items()
        if re.search(rf"{flag}\b(?!-)", said)
    ]
    return ConfigError(
        f"the server rejected its command line ({said})"
        + (f" [{'; '.join(hints)}]" if hints else "")
        + ": check the flags under server: and space: against the SGLang version on the host",
        file=cfg.source,
    )


class TrialRunner:
    """Runs trials against one server, reusing it when only client-side params change."""

    def __init__(
        self,
        cfg: StudyConfig,
        server: ServerLike,
        run_load: LoadRunner,
        score: Scorer,
        base_url: str,
        hardware: Hardware,
        knowledge: Knowledge | None = None,
        env: Mapping[str, str] | None = None,
        secret_flags: Mapping[str, str] | None = None,
        launch_template: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg = cfg
        self.server = server
        self.run_load = run_load
        self.score = score
        self.base_url = base_url
        self.hardware = hardware
        self.knowledge = knowledge or Knowledge()
        self.env = dict(env or {})
        self.secret_flags = dict(secret_flags or {})  # e.g. api-key, read from the environment
        self.launch_template = list(launch_template or cfg.target.launch)
        self.clock, self.sleep = clock, sleep
        self._running_key: str | None = None  # canonical server flags of the live server
        self.restarts = 0
        self.reuses = 0

    def flags_for(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Fixed server flags plus the trial's server-side params."""
        return {**self.cfg.server, **server_flags(params)}

    def run(
        self,
        number: int,
        params: Mapping[str, Any],
        trial_dir: Path,
        on_start: Callable[[int], None] | None = None,
    ) -> TrialOutcome:
        """One trial; raises InfraError (from the server or host) when the world failed.

        `on_start(pgid)` is called as soon as a server process group exists, so a kill of the
        tuner mid-trial still leaves a record of what to stop.
        """
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags = self.flags_for(params)
        verdict = precheck(flags, self.hardware, self.knowledge)
        if not verdict.feasible:
            return failed_outcome(self.cfg, "rejected", verdict.reason, verdict.kind, flags=flags)
        key = canonical(flags)
        restarted = False
        if self._running_key != key or self.server.check() is not None:
            spec = build_launch(
                self.launch_template, {**flags, **self.secret_flags}, self.cfg.target.port,
                self.env, self.cfg.target.workdir,
            )  # fmt: skip
            (trial_dir / "launch.txt").write_text(" ".join(redact_argv(spec.argv)) + "\n")
            self._running_key = None
            log = f"{self.cfg.target.workdir or '/tmp'}/tuner-{self.cfg.study}-trial{number}.log"
            result = self.server.restart(spec, log, on_start)
            self.restarts += 1
            restarted = True
            self._save_log(trial_dir)
            if not result.ok:
                if result.failure == "bad_flag":
                    raise _rejected_flags(self.cfg, result)
                self._learn_failure(result.failure, flags, number)
                return failed_outcome(
                    self.cfg, "start_failed", result.reason, result.failure,
                    server_info=dict(result.info), restarted=True, launched=True, flags=flags,
                )  # fmt: skip
            self._running_key = key
            self._learn_start(result.info, flags)
            info = dict(result.info)
        else:
            self.reuses += 1
            info = {}
        concurrency = int(client_params(params).get("concurrency", 1))
        load = self.run_load(self.base_url, concurrency)
        died = self._death_after(load)
        metrics = self.score(load)
        self._save_metrics(trial_dir, metrics, load)
        self._save_log(trial_dir)
        if died is not None:
            self._running_key = None
            self._save_log(trial_dir)
            return failed_outcome(
                self.cfg, "died", f"server died under load ({died})", died, metrics=metrics,
                server_info=info, restarted=restarted, launched=True, flags=flags,
            )  # fmt: skip
        constraints = slo_constraints(self.cfg, metrics)
        values = objective_values(self.cfg, metrics)
        status, reason = "ok", ""
        if load.flagged and load.stopped != "error_budget":
            # the client itself lagged: this measured the client, not the server
            status, reason = "flagged", "load run not trusted: the client lagged"
        elif any(v > 0 for v in constraints.values()):
            missed = [k.removeprefix("c_") for k, v in constraints.items() if v > 0]
            status, reason = "slo_missed", "missed SLO: " + ", ".join(missed)
        return TrialOutcome(
            status, values, constraints, reason, None, metrics, info, restarted, restarted, flags
        )

    def stop(self) -> None:
        self._running_key = None
        self.server.stop()

    def _death_after(self, load: LoadResultLike) -> str | None:
        """Did the server die during the run? A run cut by errors often races the death itself."""
        deadline = self.clock() + (DEATH_GRACE_S if load.stopped == "error_budget" else 0.0)
        while True:
            died = self.server.check()
            if died is not None or self.clock() >= deadline:
                return died
            self.sleep(0.2)

    # --- learning and records ------------------------------------------------------------

    def _learn_start(self, info: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
        tokens, mfs = info.get("max_total_num_tokens"), info.get("mem_fraction_static")
        if tokens and mfs:
            self.knowledge = self.knowledge.with_start(int(tokens), float(mfs))

    def _learn_failure(self, failure: str | None, flags: Mapping[str, Any], number: int) -> None:
        if failure == "oom_cuda_graph" and "mem-fraction-static" in flags:
            self.knowledge = self.knowledge.with_graph_failure(flags, number)

    def _save_log(self, trial_dir: Path) -> None:
        # a missing log is evidence lost, not a reason to fail the trial
        with contextlib.suppress(OSError):
            self.server.fetch_log(str(trial_dir / "server.log"))

    @staticmethod
    def _save_metrics(trial_dir: Path, metrics: Mapping[str, Any], load: LoadResultLike) -> None:
        (trial_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        with (trial_dir / "requests.jsonl").open("w") as f:
            for rec in load.records:
                f.write(json.dumps(asdict(rec), default=str) + "\n")
