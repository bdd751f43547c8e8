"""A study's load run options: the client's concurrency and error budget for one trial's run.

The one place a trial's client-side params (`concurrency`, `request-rate`) meet the study file:
the live load seam (api.py) and the virtual one (sim/virtual_study.py) both build their
`LoadOptions` here, so the two cannot drift.

- concurrency: the searched one; else `workload.concurrency`; else, under a request rate, no
  cap (bench_serving's max_concurrency None). A study with neither is refused when it is run
  (`unset_concurrency`), never run as a one-stream client.
- error budget: `workload.max_error_rate`, but never below the SLO's `max_error_rate`: a
  client that stopped a run the SLO would pass would score a feasible server as failing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.config.schema import StudyConfig
from tuner.config.workload import WorkloadSection
from tuner.loadgen.options import LoadOptions, load_options
from tuner.loadgen.timed import Refill
from tuner.loadgen.workload import EXTENDABLE, Request, more_requests


def unset_concurrency(cfg: StudyConfig) -> str | None:
    """Why the study cannot run: its client's concurrency is neither searched nor fixed, and no
    request rate leaves it uncapped (a run would have no bound on requests in flight); None
    when it can. Checked by `tune` before anything is written (key workload.concurrency)."""
    spec = cfg.space.get("concurrency")
    if cfg.workload.concurrency is not None or (spec is not None and not spec.when):
        return None
    if cfg.workload.request_rate is not None or "request-rate" in cfg.space:
        return None
    where = "searches concurrency only under when:" if spec else "does not search concurrency"
    return (
        f"the study {where} (space.concurrency) and sets no request rate: give the client's "
        "fixed concurrency here (requests in flight at once)"
    )


def client_concurrency(w: WorkloadSection, client: Mapping[str, Any]) -> int | None:
    """The concurrency a run of these client params sends at (None: no cap, with a rate)."""
    if client.get("concurrency") is not None:
        return int(client["concurrency"])
    return w.concurrency


def error_budget(cfg: StudyConfig) -> float:
    """The failed share of sent requests past which the client stops a run."""
    return max(cfg.workload.max_error_rate, cfg.objective.slo.max_error_rate)


def study_load_options(
    cfg: StudyConfig,
    client: Mapping[str, Any],
    *,
    api_key: str | None = None,
    max_loop_lag_ms: float,
) -> LoadOptions:
    """The options of one of the study's load runs at `client` (its client-side params)."""
    rate = client.get("request-rate")
    return load_options(
        cfg.workload,
        concurrency=client_concurrency(cfg.workload, client),
        request_rate=None if rate is None else float(rate),
        api_key=api_key,
        max_loop_lag_ms=max_loop_lag_ms,
        max_error_rate=error_budget(cfg),
    )


def refill_for(w: WorkloadSection) -> Refill | None:
    """A run's `more(start, n)` for a random or multi-turn workload (None: a finite list)."""
    if w.kind not in EXTENDABLE:
        return None

    def more(start: int, n: int) -> Sequence[Request]:
        return more_requests(w, start, n)

    return more


#: a finite list with fewer than this many requests per slot of the top concurrency likely runs
#: out inside its window (the synthetic kinds' default list holds 20 per slot, then refills)
PER_SLOT = 20


def short_list_problem(cfg: StudyConfig, n_requests: int) -> str | None:
    """A warning when a finite request list (shared prefixes, a dataset) is likely used up
    before a duration-bound run's window ends; None when it is not finite or not short."""
    w = cfg.workload
    if w.kind in EXTENDABLE or w.duration_s is None or w.num_requests is not None:
        return None
    spec = cfg.space.get("concurrency")
    top = int(spec.high if spec is not None and spec.high is not None else 0)
    if spec is not None and spec.choices:
        top = max(int(c) for c in spec.choices)
    top = top or w.concurrency or 1
    if n_requests >= PER_SLOT * top:
        return None
    source = (
        "num_groups x prompts_per_group" if w.kind == "shared-prefix" else f"{w.dataset}'s records"
    )
    return (
        f"workload: kind {w.kind} has {n_requests:,} requests ({source}), fewer than "
        f"{PER_SLOT} per slot at concurrency {top}: a run that sends them all before its "
        f"{w.duration_s:g} s window ends stops early (metrics.json `exhausted: true`) and "
        "measures a shorter window; each prompt is sent once (a repeat would hit the prefix "
        "cache). Give more requests, or bound the run by workload.num_requests"
    )


def longer_run(w: WorkloadSection) -> str:
    """The workload key that lengthens a load run, with its value (a warning's advice)."""
    if w.duration_s:
        return f"workload.duration_s (now {w.duration_s:g} s)"
    return f"workload.num_requests (now {w.num_requests})"
