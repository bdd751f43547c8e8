"""Two-level search: which studies find concurrency on the running server (trial/inner.py runs
it), and what the sampler proposes then.

`space.concurrency.search` chooses:

- `inner`: the sampler proposes server configurations only (`sampled_space` drops
  concurrency); each server that starts gets `search.inner.search` over concurrency, a few load
  runs and never a restart. The trial's value is its point that the study's curve pooled over
  its servers ranks best (search/curve.py), as measured; every point is kept
  (`Attr.LOAD_POINTS`, `trials/<n>/points.json`) and the winner's concurrency is the trial's
  `Attr.CLIENT`, which confirmation re-runs and the export recommends.
- `joint`: concurrency is one more sampled parameter (with concurrency probes), as before.

Unset, a log or linear concurrency range searches `DEFAULT_SEARCH`; a list of choices, a
client-side request rate (`workload.request_rate` or a searched `request-rate`), a Pareto
objective, a concurrency under `when:` and a space of concurrency alone keep `joint`. A study
without concurrency in its space runs at `workload.concurrency` (uncapped under a request rate:
loadgen/plan.py). The search runs only the range's points (`step`); the baseline's concurrency is
where trial 0's search starts (`InnerSearch.start_next`).
"""

from __future__ import annotations

from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS, ParamSpec

#: the mode of a concurrency range whose `search:` is unset (from tests/bench/bench_search.py)
DEFAULT_SEARCH = "inner"


NAME = "concurrency"


def search_mode(cfg: StudyConfig) -> str:
    """`inner`, `joint`, or `fixed` (concurrency is not searched)."""
    spec = cfg.space.get(NAME)
    if spec is None:
        return "fixed"
    if spec.search:
        return spec.search
    rate = cfg.workload.request_rate is not None or "request-rate" in cfg.space
    alone = all(k in CLIENT_PARAMS for k in cfg.space)  # one server: nothing to sample above it
    if spec.choices is not None or rate or cfg.objective.pareto_latency or spec.when or alone:
        return "joint"
    return DEFAULT_SEARCH


def inner_mode(cfg: StudyConfig) -> bool:
    return search_mode(cfg) == "inner"


def sampled_space(cfg: StudyConfig) -> dict[str, ParamSpec]:
    """What the sampler proposes: the space, less concurrency when the inner search finds it."""
    if inner_mode(cfg):
        return {k: v for k, v in cfg.space.items() if k != NAME}
    return dict(cfg.space)


#: a duration-bound load run takes its window plus warm-up, cache flush and the cut's drain:
#: about this share of the window more, and this many seconds (measured on the simulator)
RUN_OVERHEAD = 0.1


RUN_OVERHEAD_S = 5.0


def trial_time_problem(cfg: StudyConfig) -> str | None:
    """A warning when budget.trial_timeout cannot hold the inner search's load runs (the search
    then stops at the deadline with fewer points than budget.inner_runs); None when it can or
    when the runs' length is not known (a request-count bound)."""
    window = cfg.workload.duration_s
    if not inner_mode(cfg) or window is None:
        return None
    runs, limit = cfg.budget.inner_runs, float(cfg.budget.trial_timeout)
    each = window * (1 + RUN_OVERHEAD) + RUN_OVERHEAD_S
    if runs * each <= limit:
        return None
    fits = max(1, int(limit // each))
    return (
        f"budget.trial_timeout {limit:g} s holds about {fits} of the inner search's "
        f"{runs} load runs (budget.inner_runs; ~{each:.0f} s each with a {window:g} s window), "
        f"before counting the server's start: each server would be searched with fewer points. "
        f"Raise budget.trial_timeout to at least {runs * each:.0f} s plus the start-up time, "
        "or lower budget.inner_runs"
    )


def mode_problem(cfg: StudyConfig) -> tuple[str, str] | None:
    """(key, why) when `search:` is set where it cannot work; None when it is fine."""
    for name, spec in cfg.space.items():
        if spec.search and name != NAME:
            return f"space.{name}.search", "only concurrency (a client-side knob) takes search:"
    if inner_mode(cfg):
        for name, spec in cfg.space.items():
            if NAME in (spec.when or {}):
                return f"space.{name}.when", (
                    f"cannot depend on {NAME}: the inner search finds it on the running server, "
                    "after the flags are chosen (or set space.concurrency.search: joint)"
                )
    spec = cfg.space.get(NAME)
    if spec is None or spec.search != "inner":
        return None
    key = f"space.{NAME}.search"
    if spec.choices is not None or spec.kind != "int":
        return key, "inner needs an integer range (low, high), not choices"
    if spec.when:
        return key, "inner needs concurrency searched on every server (no when:)"
    if cfg.workload.request_rate is not None or "request-rate" in cfg.space:
        return key, "inner searches a closed loop's concurrency; with a request rate use joint"
    if cfg.objective.pareto_latency:
        return key, "inner keeps the best throughput; with objective.pareto_latency use joint"
    return None
