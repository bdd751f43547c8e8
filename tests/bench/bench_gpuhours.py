"""GPU-hours to the optimum, in virtual time, with `budget.early_stop` off and on (not CI).

Run: `python tests/bench/bench_gpuhours.py --cases demo --seeds 2` (`--help` for the rest;
`--cache DIR` keeps each case's brute force between runs, in bench_search's format) or
`pytest -m bench tests/bench/bench_gpuhours.py -s` (the demo, 2 seeds, 15 restarts).

Per case and seed, the default strategy of bench_search runs twice per switch ("before":
`early_stop: false`, "after": `early_stop: true`), same seeds, with the simulator's start-up
the profile's own (`startup_s`: Kimi 600 s, Llama-70B 240 s, Llama-8B 60 s), not
bench_search's 1 s:

- the curve: the search alone (no confirmation) until `--budget` restarts. After each trial its
  pick (bench_search.pick: the best feasible measured trial so far) is scored as bench_search
  scores picks (robustly, on held-out starts, against the brute-force optimum); the figure is
  the GPU-hours (trial/spent.py's records: server_s x gpus / 3600, on the virtual clock) spent
  up to the first trial whose pick reached 0.98 of the optimum. A study that never got there
  shows what it spent as ">X".
- the night: the study file as the case configures it (its confirmation included) with
  `budget.timeout: 8h` on the virtual clock; what `tuner export` would write, scored the same
  way, and the GPU-hours and restarts (trials that started a server, plus confirmation runs)
  it spent.

The brute force and the robust scores use bench_search's case (1 s start-ups: a start-up's
length changes no score). Each case prints how long it took.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: the helpers import as tests.*
    sys.path.insert(0, str(REPO))

from tests.bench import bench_search as bs  # noqa: E402
from tests.bench.gpuhours_curve import SHARE, Reach, hours_to, median, ratio, worst  # noqa: E402
from tests.bench.search_robust import ROBUST_SETS, TMP, search  # noqa: E402
from tuner.api import tune  # noqa: E402
from tuner.config.load import parse_study  # noqa: E402
from tuner.config.schema import StudyConfig  # noqa: E402
from tuner.outcome import Attr, full_params  # noqa: E402
from tuner.sim.profile import load_profile  # noqa: E402
from tuner.sim.virtual.study import virtual_seams  # noqa: E402
from tuner.verdict.gpuhours import PHASE_NAMES, gpu_hours, gpu_time  # noqa: E402
from tuner.verdict.trials import all_confirmations  # noqa: E402
from tuner.verdict.winner import best_trial  # noqa: E402

pytestmark = pytest.mark.bench

#: budget.early_stop of each side
SWITCHES = {"before": False, "after": True}
#: the fixed budget on the virtual clock (budget.timeout)
NIGHT_H = 8
STARTUP_FLAG = "--sim-startup-seconds"
#: `--night-trials`: the nights' trial cap (None: 4 x --budget, as bench_search's search caps)
NIGHT_TRIALS: list[int | None] = [None]


# --- the cases: bench_search's four, two more Kimi ones -----------------------------------------


def kimi_shipped() -> dict[str, Any]:
    """search_spaces/kimi-k2.5-tp8.yaml as shipped (all five parameters, 300 s windows, 3 x 2
    confirmation, 45 m trials) on the simulator."""
    d = bs._shipped("kimi-k2.5-tp8.yaml")
    d["study"] = "kimi-shipped"
    d["target"] = {"host": "local", "launch": [*bs.SIM, "kimi-k2.5-tp8"], "port": 30000}
    return d


def kimi_90() -> dict[str, Any]:
    """bench_search's Kimi shared-prefix case (mfs x hicache x concurrency) at 90 s windows."""
    d = bs.kimi()
    d["study"] = "kimi-90"
    d["workload"]["duration_s"] = 90
    return d


EXTRA = {
    "kimi-shipped": bs.Case("Kimi-K2.5 TP8 as shipped (5 parameters, 300 s)", kimi_shipped, 8),
    "kimi-90": bs.Case("Kimi-K2.5 TP8 shared prefix, 90 s windows", kimi_90, 12),
}
# registered where bench_search looks cases up (its brute force and scores run in its pool)
bs.CASES.update(EXTRA)
DEFAULT_CASES = ("demo", "tight", "kimi", "seventy", "kimi-shipped", "kimi-90")


def with_profile_startup(launch: Sequence[str]) -> list[str]:
    """The simulator's launch with its start-up the profile's own `startup_s` (the simulator's
    default is 1.5 s, bench_search's 1 s)."""
    argv = list(launch)
    if STARTUP_FLAG in argv:
        i = argv.index(STARTUP_FLAG)
        del argv[i : i + 2]
    profile = argv[argv.index("--sim-profile") + 1]
    return [*argv, STARTUP_FLAG, f"{load_profile(profile).startup_s:g}"]


def study_data(case: str, kind: str, early_stop: bool) -> dict[str, Any]:
    """The study file of one side: `curve` is bench_search's default strategy (search only,
    the restart budget ends it), `night` its `confirmed` one (the case's confirmation) with an
    8-hour timeout; both with the profile's start-ups."""
    d = copy.deepcopy(bs.strategy_data(case, "default" if kind == "curve" else "confirmed"))
    d["target"]["launch"] = with_profile_startup(d["target"]["launch"])
    d["budget"]["early_stop"] = early_stop
    if kind == "night":
        d["budget"]["timeout"] = NIGHT_H * 3600
    d["study"] = f"{d['study']}-{kind}-{'on' if early_stop else 'off'}"
    return d


def study_cfg(case: str, kind: str, early_stop: bool) -> StudyConfig:
    return parse_study(study_data(case, kind, early_stop), f"{case}-{kind}.yaml")


# --- one study ------------------------------------------------------------------------------


@dataclass
class Curve:
    """One study's search: its trials as bench_search reads them, and each one's GPU-hours."""

    case: str
    side: str
    seed: int
    rows: list[bs.Row]
    hours: list[float]
    wall_s: float
    #: each trial's record by phase (trial/spent.py), for `--dump`: what a cut could save
    spent: list[dict[str, Any]] = field(default_factory=list)

    def picks(self) -> list[dict[str, Any] | None]:
        """The pick after each trial."""
        return [bs.pick(self.rows[: i + 1]) for i in range(len(self.rows))]


@dataclass
class Night:
    """One study stopped by its 8-hour timeout and confirmed: what the export writes."""

    case: str
    side: str
    seed: int
    pick: dict[str, Any] | None
    gpu_hours: float
    restarts: int
    hours: float  # on the virtual clock, confirmation included (8 unless the trial cap came first)
    wall_s: float
    ratio: float = 0.0  # the pick's robust score over the optimum, once scored
    capped: bool = False  # the trial cap ended it before the timeout


def run_curve(case: str, side: str, seed: int, budget: int) -> Curve:
    import optuna

    cfg = study_cfg(case, "curve", SWITCHES[side])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-gpuh-", dir=TMP) as tmp:
        search(cfg, bs.requests_of(case), seed, budget, Path(tmp))
        study = optuna.load_study(study_name=cfg.study, storage=_url(tmp, cfg))
        trials = study.get_trials(deepcopy=False)
        rows = [bs._row(t) for t in trials]
        spent = [dict(t.user_attrs.get(Attr.SPENT) or {}) for t in trials]
    hours = [gpu_hours(x) for x in spent]
    return Curve(case, side, seed, rows, hours, time.perf_counter() - t0, spent)


def run_night(case: str, side: str, seed: int, budget: int) -> Night:
    """The trials are capped (`NIGHT_TRIALS`, else 4 x `budget`) should the timeout not come
    first: a small space runs out of new configurations (duplicates take no virtual time), and
    with nothing feasible found nothing is left to confirm."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    cfg = study_cfg(case, "night", SWITCHES[side])
    t0 = time.perf_counter()
    seams = virtual_seams(seed, requests=bs.requests_of(case))
    clocks = []

    def make_seams(*args: Any) -> Any:
        built = seams(*args)
        clocks.append(built.runner.clock)  # the virtual clock: how long the night really ran
        return built

    with tempfile.TemporaryDirectory(prefix="bench-gpuh-", dir=TMP) as tmp:
        tune(
            cfg,
            runs_dir=Path(tmp),
            seed=seed,
            n_trials=NIGHT_TRIALS[0] or 4 * budget,
            make_seams=make_seams,
        )
        study = optuna.load_study(study_name=cfg.study, storage=_url(tmp, cfg))
        trials = study.get_trials(deepcopy=False)
        best, _ = best_trial(study)
        spent = gpu_time(trials, study.user_attrs, None).total
        restarts = sum(bool(t.user_attrs.get(Attr.LAUNCHED)) for t in trials)
        restarts += sum(len(v) for v in all_confirmations(study).values())
        pick = None if best is None else full_params(best.params, best.user_attrs)
        capped = len(trials) >= (NIGHT_TRIALS[0] or 4 * budget)
    hours = clocks[0]() / 3600
    wall = time.perf_counter() - t0
    return Night(case, side, seed, pick, spent, restarts, hours, wall, capped=capped)


def _url(tmp: str, cfg: StudyConfig) -> str:
    return f"sqlite:///{tmp}/{cfg.study}/study.db"


def _task(args: tuple[str, str, str, int, int]) -> Curve | Night:
    kind, case, side, seed, budget = args
    return (run_curve if kind == "curve" else run_night)(case, side, seed, budget)


# --- the table ------------------------------------------------------------------------------


@dataclass
class Result:
    """One case: per side, every seed's reach and night."""

    case: str
    optimum: float
    optimum_params: dict[str, Any]
    reach: dict[str, list[Reach]] = field(default_factory=dict)
    nights: dict[str, list[Night]] = field(default_factory=dict)
    restarts_to: dict[str, list[int | None]] = field(default_factory=dict)
    wall_s: float = 0.0


def reach_of(rep: bs.Report, curve: Curve) -> tuple[Reach, int | None]:
    """The curve's GPU-hours to the share, and the restarts it took (None: not reached)."""
    ratios = [rep.ratio(p) for p in curve.picks()]
    got = hours_to(list(zip(curve.hours, ratios, strict=True)))
    if not got.reached:
        return got, None
    i = next(i for i, r in enumerate(ratios) if r >= SHARE)
    return got, sum(r.launched for r in curve.rows[: i + 1])


HEADER = (
    "| case | optimum | GPU-h to >= 0.98, median (worst): before | after | after/before "
    "| restarts to it, median: before / after | 8 h: pick/optimum median/worst: before | after "
    "| 8 h: GPU-h, restarts (median): before | after | wall |"
)


def row(res: Result) -> str:
    def side(s: str) -> str:
        xs = res.reach.get(s)
        if not xs:
            return "pending"
        got = sum(r.reached for r in xs)
        return f"{median(xs)} ({worst(xs)})" + (
            f", {got}/{len(xs)} reached" if got < len(xs) else ""
        )

    def restarts(s: str) -> str:
        xs = res.restarts_to.get(s)
        if not xs:
            return "-"
        m = statistics.median(x if x is not None else math.inf for x in xs)
        return f"{m:g}" if math.isfinite(m) else "not reached"

    def night(s: str, what: str) -> str:
        ns = res.nights.get(s)
        if not ns:
            return "pending"
        if what == "quality":
            return bs._med_worst([n.ratio for n in ns])
        h = statistics.median(n.gpu_hours for n in ns)
        r = statistics.median(n.restarts for n in ns)
        # under 8 h: the trial cap came first, or the time kept for confirmation went unspent
        lo, hi = min(n.hours for n in ns), max(n.hours for n in ns)
        capped = sum(n.capped for n in ns)
        note = f"ran {lo:.1f}-{hi:.1f} h" + (f", {capped} at the trial cap" if capped else "")
        return f"{h:.1f}, {r:g}" + (f" ({note})" if hi < NIGHT_H - 0.5 or capped else "")

    b, a = res.reach.get("before"), res.reach.get("after")
    change = ratio(median(a), median(b)) if a and b else "-"
    return (
        f"| {res.case} | {res.optimum:,.0f} | {side('before')} | {side('after')} | {change} "
        f"| {restarts('before')} / {restarts('after')} "
        f"| {night('before', 'quality')} | {night('after', 'quality')} "
        f"| {night('before', 'spent')} | {night('after', 'spent')} | {res.wall_s:.0f} s |"
    )


# --- driver ---------------------------------------------------------------------------------


def bench(
    cases: Sequence[str],
    seeds: int,
    budget: int,
    jobs: int,
    sides: Sequence[str] = tuple(SWITCHES),
    cache: Path | None = None,
    dump: Path | None = None,
    out=print,
) -> list[Result]:
    """Per case: the brute force (or its cache), every side's curves and nights, the robust
    scores of every pick, then its row."""
    results = []
    with ProcessPoolExecutor(jobs) as pool:
        for case in cases:
            t_case = time.perf_counter()
            cached = bs._cache_path(cache, case)
            if cached is not None and cached.exists():
                scores = json.loads(cached.read_text())
            else:
                scores = bs.brute_force(case, pool, jobs)
                if cached is not None:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    cached.write_text(json.dumps(scores))
            out(f"[{case}] brute force: {len(scores)} configurations, {_since(t_case)}")
            t0 = time.perf_counter()
            tasks = [
                (kind, case, s, seed, budget)
                for kind in ("curve", "night")
                for s in sides
                for seed in range(seeds)
            ]
            done = list(pool.map(_task, tasks))
            curves = [x for x in done if isinstance(x, Curve)]
            nights = [x for x in done if isinstance(x, Night)]
            out(f"[{case}] {len(tasks)} studies, {_since(t0)}")
            rep = bs.Report(case, 0.0, {}, len(scores), truths=scores)
            rep.extra = [p for c in curves for p in c.picks() if p is not None]
            rep.extra += [n.pick for n in nights if n.pick is not None]
            bs._score_picks(rep, (), pool, jobs, out)
            res = Result(case, rep.optimum, rep.optimum_params)
            for c in curves:
                got, n = reach_of(rep, c)
                res.reach.setdefault(c.side, []).append(got)
                res.restarts_to.setdefault(c.side, []).append(n)
            for n in nights:
                n.ratio = rep.ratio(n.pick)
                res.nights.setdefault(n.side, []).append(n)
            for side in sides:
                out(f"[{case}] {side}: {phases([c for c in curves if c.side == side])}")
            res.wall_s = time.perf_counter() - t_case
            out(f"[{case}] optimum {rep.optimum:,.0f} at {rep.optimum_params}; {_since(t_case)}")
            out(HEADER + "\n" + row(res))
            results.append(res)
            if dump is not None:
                dump.mkdir(parents=True, exist_ok=True)
                (dump / f"gpuhours-{case}.json").write_text(
                    json.dumps(_dumped(rep, res, curves, nights), indent=1)
                )
    out("\n" + HEADER + "\n" + _rule())
    for res in results:
        out(row(res))
    return results


def phases(curves: Sequence[Curve]) -> str:
    """Where the curves' GPU-hours went, all seeds together: a cut load run saves only the
    load's share."""
    total = {k: sum(gpu_hours(x, k) for c in curves for x in c.spent) for k in PHASE_NAMES}
    whole = sum(total.values()) or 1.0
    shares = ", ".join(f"{PHASE_NAMES[k]} {100 * v / whole:.0f}%" for k, v in total.items())
    return f"GPU-hours of the curves by phase: {shares}"


def _rule() -> str:
    return "|" + "---|" * (HEADER.count("|") - 1)


def _since(t0: float) -> str:
    return f"{time.perf_counter() - t0:.0f} s"


def _dumped(
    rep: bs.Report, res: Result, curves: list[Curve], nights: list[Night]
) -> dict[str, Any]:
    """A case's curves and nights, seed by seed (`--dump`)."""
    return {
        "optimum": rep.optimum,
        "optimum_params": rep.optimum_params,
        "curves": {
            f"{c.side}/{c.seed}": [
                {
                    "gpu_hours": h,
                    "launched": r.launched,
                    "status": r.status,
                    "ratio": rep.ratio(p),
                    "spent": x,
                }
                for h, r, p, x in zip(c.hours, c.rows, c.picks(), c.spent, strict=True)
            ]
            for c in curves
        },
        "nights": {
            f"{n.side}/{n.seed}": {
                "pick": n.pick,
                "ratio": rep.ratio(n.pick),
                "gpu_hours": n.gpu_hours,
                "restarts": n.restarts,
                "hours": n.hours,
                "capped": n.capped,
            }
            for n in nights
        },
        "reach": {s: [[r.hours, r.reached] for r in xs] for s, xs in res.reach.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = ",".join([*DEFAULT_CASES, "generation"])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated: {every}")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--budget", type=int, default=40, help="restarts per curve study")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--night-trials", type=int, help="trial cap of the 8 h studies (4 x --budget)")
    p.add_argument("--sides", default=",".join(SWITCHES), help="before (early_stop off), after")
    p.add_argument("--cache", type=Path, help="keep each case's brute force here between runs")
    p.add_argument("--dump", type=Path, help="write each case's curves and nights here as JSON")
    p.add_argument("--sets", type=int, default=ROBUST_SETS[0], help="sets of starts per score")
    a = p.parse_args(argv)
    ROBUST_SETS[0], NIGHT_TRIALS[0] = a.sets, a.night_trials
    bench(
        a.cases.split(","),
        a.seeds,
        a.budget,
        a.jobs,
        a.sides.split(","),
        cache=a.cache,
        dump=a.dump,
    )


def test_bench_gpuhours() -> None:
    """The demo, 2 seeds, 15 restarts: every curve spent GPU-hours, every night exported a
    feasible configuration."""
    (res,) = bench(["demo"], 2, 15, 1)
    for side in SWITCHES:
        assert all(r.hours > 0 for r in res.reach[side])
        assert all(0 < n.ratio <= 1.1 for n in res.nights[side])


if __name__ == "__main__":
    main()
