"""The trial record: what one trial measured or why it could not, and how it is stored. Pure.

Every fact about a trial that more than one module reads lives here once:

- `Status`: what happened to the configuration (measured, missed its SLOs, rejected, ...);
- `Attr`: the optuna user-attribute keys a trial is stored under;
- `is_feasible`: the one feasibility rule (every constraint <= 0, optuna's convention);
- `TrialOutcome` with `to_attrs()` / `from_attrs()`: the record itself, written and read back.

Every completed trial carries the same constraint keys (GPSampler requires it): `c_start` is 1
when the server could not run the config (pre-check rejection, failed start, death under load);
the latency ones are observed/limit - 1, or -1 when no limit is set; `c_errors` is the error
rate above the limit, or -1.

What other tools read (optuna-dashboard, `optuna.visualization`, `study.trials_dataframe()`):
the objective value of a configuration that missed its SLOs is as pessimistic as one that did
not run (0), because optuna-dashboard names its best trial by value alone; what it measured
stays in `metrics` and in one numeric user attribute per main metric (`METRIC_ATTRS`,
sortable). TPE ranks infeasible trials by their violation, never by value, so it learns the
same; GPSampler's objective model sees 0 there, as for a failed start.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tuner.config.objective import ObjectiveSection

CONSTRAINT_KEYS = ("c_start", "c_ttft", "c_tpot", "c_itl", "c_e2e", "c_errors")
SLO_METRICS = {  # constraint key -> (slo field, metrics JSON key)
    "c_ttft": ("p99_ttft_ms", "p99_ttft_ms"),
    "c_tpot": ("p99_tpot_ms", "p99_tpot_ms"),
    "c_itl": ("p99_itl_ms", "p99_itl_ms"),
    "c_e2e": ("p99_e2e_latency_ms", "p99_e2e_latency_ms"),
}
#: second objective of a configuration that did not run (pareto mode): worse than anything measured
PESSIMISTIC_LATENCY_MS = 1e7
#: where a trial's constraints are stored: optuna's list attribute, in CONSTRAINT_KEYS order.
#: optuna-dashboard reads only this one; optuna 5 (samplers, `trial.constraints`,
#: `optuna.visualization`) reads it and its per-key `constraints:<key>` attributes alike, under
#: the keys "0".."5". One copy only: GPSampler would model a constraint stored twice twice.
#: Studies written before keep their per-key constraints (`named_constraints` reads both).
DASHBOARD_CONSTRAINTS = "constraints"
#: the load run's main figures, each stored as its own numeric user attribute of a measured
#: trial (the whole run stays under `metrics`); `max_total_num_tokens` is the server's KV pool
METRIC_ATTRS = (
    "window_output_throughput",
    "output_throughput",
    "request_throughput",
    "goodput",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2e_latency_ms",
    "error_rate",
)
POOL_ATTR = "max_total_num_tokens"
#: a trial's `Attr.SPENT` record: seconds by phase (trial/spent.py), with `server_s`, `gpus`
SPENT_KEYS = ("startup_s", "warmup_s", "load_s", "stop_s", "other_s")


class Status(StrEnum):
    """What happened to a trial's configuration."""

    OK = "ok"  # measured, every SLO held
    SLO_MISSED = "slo_missed"  # measured, an SLO missed
    REJECTED = "rejected"  # the pre-check knew it cannot start: no restart spent
    START_FAILED = "start_failed"  # the server could not start with these flags
    DIED = "died"  # the server died under load
    FLAGGED = "flagged"  # the load run measured the client, not the server: not trusted
    #: the server failed without evidence against its flags (crash with no SGLang message,
    #: not ready in time, hung): the world's failure, retried within bounds
    WORLD = "world"
    #: a load run ended early: it could not beat the best point known (search/cut.py); an inner
    #: search's point, never a trial's score (its figures are a partial window's)
    CUT = "cut"

    @property
    def measured(self) -> bool:
        """A load run scored this configuration."""
        return self in (Status.OK, Status.SLO_MISSED)


_STATUS_VALUES = frozenset(s.value for s in Status)


class Attr(StrEnum):
    """Optuna user-attribute keys of a trial (what `tuner status`, export and report read)."""

    STATUS = "status"
    REASON = "reason"
    FAILURE = "failure"  # the server's failure class (tuner.sglang.failures.FailureClass)
    METRICS = "metrics"  # the load run's JSON (bench_serving's keys)
    SERVER_INFO = "server_info"  # what the started server reported (pool size, version, ...)
    RESTARTED = "restarted"  # this trial restarted the server (else it reused the running one)
    LAUNCHED = "launched"  # a server process was started for it
    WORKER = "worker"
    HOME = "worker_home"  # where the worker runs: machine and runs folder (worklock.home_of)
    DUPLICATE_OF = "duplicate_of"  # answered from this earlier trial, nothing run
    INFRA_ERROR = "infra_error"  # the world failed: why (the trial is FAIL)
    SERVER_PGID = "server_pgid"  # process group of the server this trial started
    RETRIES = "retries"  # how many times these params were re-run after an infra failure
    RETRY_OF = "retry_of"
    PROBE_OF = "probe_of"  # a neighbouring concurrency on the server this trial started
    PROBES_LEFT = "probes_left"
    EDGE_OF = "edge_of"  # mfs raised toward its cliff from this best trial's (search/edge.py)
    EDGE_PIN = "edge_pin"  # mfs pinned at this best trial's cliff, the other flags sampled
    EDGE_NEIGHBOUR = "edge_neighbour"  # this best's params, one layout flag changed (neighbour.py)
    BASELINE = "baseline"  # trial 0: the study file's baseline or SGLang's defaults
    #: a world failure that came back the same way on every retry, counted as the config's
    REPRODUCED = "reproduced"
    LOAD_POINTS = "load_points"  # the inner search's load runs on its server (report/runs.py)
    CLIENT = "inner_client"  # the client params the inner search chose (its best point's)
    #: the measured run's latency bins and request counts (verdict.tails.tails_of; inner: the best
    #: point's), pooled with its confirmation runs' for the winner's verdict (verdict/winner.py)
    TAILS = "latency_tails"
    #: where the trial's server time went, by phase, and its GPUs (trial/spent.py)
    SPENT = "time_spent"


#: the attributes an outcome writes; copied as a whole when a duplicate is answered. Not
#: `Attr.TAILS`: the tails are one run's requests, pooled once, for the trial that ran them (a
#: duplicate is no candidate, and a copy would be the same requests counted twice)
OUTCOME_ATTRS = (
    Attr.STATUS,
    Attr.REASON,
    Attr.FAILURE,
    Attr.METRICS,
    Attr.SERVER_INFO,
    Attr.RESTARTED,
    Attr.LAUNCHED,
)


def retry_attrs(number: int, attrs: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """The user attributes a re-enqueued try of trial `number` starts with: what it retries,
    and whether it is the baseline (which a resumed run must still measure)."""
    return {
        Attr.RETRY_OF: number,
        **more,
        **({Attr.BASELINE: True} if attrs.get(Attr.BASELINE) else {}),
    }


def full_params(params: Mapping[str, Any], attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's params plus the client params its inner search chose (none in joint mode)."""
    return {**params, **(attrs.get(Attr.CLIENT) or {})}


def is_feasible(constraints: Mapping[str, float]) -> bool:
    """The feasibility rule: constraints were recorded and every one is <= 0."""
    return bool(constraints) and all(v <= 0 for v in constraints.values())


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial measured or why it could not; study/loop.py turns it into an optuna state."""

    status: Status
    values: tuple[float, ...]
    constraints: Mapping[str, float]
    reason: str = ""
    failure: str | None = None  # server failure class (oom_cuda_graph, host_memory, ...)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    server_info: Mapping[str, Any] = field(default_factory=dict)
    restarted: bool = False
    launched: bool = False
    flags: Mapping[str, Any] = field(default_factory=dict)
    points: tuple[Mapping[str, Any], ...] = ()  # the inner search's load runs (trial/inner.py)
    client: Mapping[str, Any] = field(default_factory=dict)  # the inner search's best
    tails: Mapping[str, Any] | None = (
        None  # a measured run's verdict.tails.tails_of (None: none kept)
    )

    @property
    def feasible(self) -> bool:
        return is_feasible(self.constraints)

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes this outcome is stored under (JSON-safe): the record, and for a
        measured run its main figures as numbers (`METRIC_ATTRS`, `POOL_ATTR`)."""
        attrs: dict[str, Any] = {
            Attr.STATUS: str(self.status),
            Attr.REASON: self.reason,
            Attr.FAILURE: None if self.failure is None else str(self.failure),
            Attr.METRICS: _json_safe(self.metrics),
            Attr.SERVER_INFO: _json_safe(self.server_info),
            Attr.RESTARTED: self.restarted,
            Attr.LAUNCHED: self.launched,
        }
        if self.status.measured:
            attrs.update(metric_attrs(self.metrics))
        if self.points:
            attrs[Attr.LOAD_POINTS] = _json_safe(list(self.points))
            attrs[Attr.CLIENT] = dict(self.client) or None
        if self.tails is not None:
            attrs[Attr.TAILS] = _json_safe(self.tails)
        pool = self.server_info.get(POOL_ATTR)
        if _number(pool):
            attrs[POOL_ATTR] = pool
        return attrs

    @classmethod
    def from_attrs(
        cls,
        attrs: Mapping[str, Any],
        values: tuple[float, ...] | None = None,
        constraints: Mapping[str, float] | None = None,
    ) -> TrialOutcome | None:
        """An outcome read back from a stored trial; None for a trial that recorded none."""
        status = attrs.get(Attr.STATUS)
        if status not in _STATUS_VALUES:
            return None
        return cls(
            Status(status),
            tuple(values or ()),
            dict(constraints or {}),
            attrs.get(Attr.REASON) or "",
            attrs.get(Attr.FAILURE),
            dict(attrs.get(Attr.METRICS) or {}),
            dict(attrs.get(Attr.SERVER_INFO) or {}),
            bool(attrs.get(Attr.RESTARTED)),
            bool(attrs.get(Attr.LAUNCHED)),
            tails=attrs.get(Attr.TAILS),
        )


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def metric_attrs(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The main figures of a run's metrics that it reported, as plain numbers."""
    return {k: float(metrics[k]) for k in METRIC_ATTRS if _number(metrics.get(k))}


def named_constraints(constraints: Mapping[str, float]) -> dict[str, float]:
    """A stored trial's constraints under their names (`c_start`, ...), whether optuna gives
    them by name (studies written before the list) or by position in the list ("0", "1", ...)."""
    if all(k in constraints for k in CONSTRAINT_KEYS):
        return {k: constraints[k] for k in CONSTRAINT_KEYS}
    by_index = {str(i): k for i, k in enumerate(CONSTRAINT_KEYS)}
    return {by_index.get(k, k): v for k, v in constraints.items()}


def missed_slos(constraints: Mapping[str, float]) -> list[str]:
    """The SLOs a trial's constraints say it missed (`ttft`, `errors`, ...)."""
    named = named_constraints(constraints)
    return [k.removeprefix("c_") for k in CONSTRAINT_KEYS if named.get(k, 0.0) > 0]


def slo_constraints(objective: ObjectiveSection, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The constraint values of a measured run (all keys; <= 0 is within the limit)."""
    out = {"c_start": -1.0}
    slo = objective.slo
    for key, (slo_field, metric_key) in SLO_METRICS.items():
        limit = getattr(slo, slo_field)
        out[key] = -1.0 if limit is None else float(metrics.get(metric_key, 0.0)) / limit - 1.0
    rate = float(metrics.get("error_rate", 0.0))
    out["c_errors"] = rate - slo.max_error_rate if rate > slo.max_error_rate else -1.0
    return out


def objective_values(objective: ObjectiveSection, metrics: Mapping[str, Any]) -> tuple[float, ...]:
    """The study's objective(s) from one run's metrics.

    A duration-bounded run cuts the requests still in flight at its end; counting only completed
    requests would score long requests at high concurrency as zero, so the default score is the
    window figure (all tokens received in the window / duration). A run that reports only
    `output_throughput` cut nothing, and then both figures are one.
    """
    main = float(score_of(objective.metric, metrics) or 0.0)
    if objective.pareto_latency:
        return (main, float(metrics.get(objective.pareto_latency, PESSIMISTIC_LATENCY_MS)))
    return (main,)


def score_of(metric: str, metrics: Mapping[str, Any]) -> float | None:
    """What a run measured of the study's metric (None: not reported)."""
    value = metrics.get(metric)
    if value is None and metric == "window_output_throughput":
        value = metrics.get("output_throughput")
    return None if value is None else float(value)


def pessimistic_values(objective: ObjectiveSection) -> tuple[float, ...]:
    """The value(s) of a configuration that did not run or missed its SLOs: worse than any
    feasible measurement, so a tool that picks the best by value alone picks a feasible one."""
    if objective.pareto_latency:
        return (0.0, PESSIMISTIC_LATENCY_MS)
    return (0.0,)


def measured_outcome(
    objective: ObjectiveSection,
    metrics: Mapping[str, Any],
    *,
    client_lagged: bool,
    **kw: Any,
) -> TrialOutcome:
    """A configuration that ran its load: scored, with its SLO verdict."""
    constraints = slo_constraints(objective, metrics)
    values = objective_values(objective, metrics)
    status, reason = Status.OK, ""
    if client_lagged:
        status, reason = Status.FLAGGED, "load run not trusted: the client lagged"
    elif not is_feasible(constraints):
        status, reason = Status.SLO_MISSED, "missed SLO: " + ", ".join(missed_slos(constraints))
        values = pessimistic_values(objective)  # what it measured stays in `metrics`
    return TrialOutcome(status, values, constraints, reason, None, metrics, **kw)


def cut_outcome(
    objective: ObjectiveSection, metrics: Mapping[str, Any], reason: str, **kw: Any
) -> TrialOutcome:
    """A load run cut early: no score (pessimistic values); its SLO verdict so far stays in
    `constraints`, which steers the inner search, with the partial window's figures."""
    constraints = slo_constraints(objective, metrics)
    return TrialOutcome(
        Status.CUT, pessimistic_values(objective), constraints, reason, None, metrics, **kw
    )


def failed_outcome(
    objective: ObjectiveSection, status: Status, reason: str, failure: str | None, **kw: Any
) -> TrialOutcome:
    """A configuration that could not run: pessimistic value, start constraint violated."""
    constraints = dict.fromkeys(CONSTRAINT_KEYS, 1.0)
    return TrialOutcome(status, pessimistic_values(objective), constraints, reason, failure, **kw)
