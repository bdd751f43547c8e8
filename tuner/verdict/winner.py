"""The winner of a study: its configurations ranked by what a start of theirs is worth, how far
the best leads the runner-up, and what confirmation should run again. No writes.

A candidate holds its SLOs on every request of its runs pooled (verdict/tails.py); a run that
missed on its own counts 0 in its mean (a server serves on the luck of one start), and a pass
within the noise of a limit counts its odds of holding, and a shaky lead within the run-to-run
noise yields to a steady candidate. `best_trial` picks the winner,
`versus_runner_up` says whether its lead is beyond the run-to-run noise, `unsettled` names what
confirmation runs again (a shaky winner, a tie the rounds left could part).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import optuna
from optuna.trial import FrozenTrial

from tuner.outcome import Attr, full_params
from tuner.search.space import canonical
from tuner.verdict.tails import (
    exceed_odds,
    first_bias,
    hold_odds,
    log_ratios,
    near_limits,
    noise_sd,
    pooled_verdict,
)
from tuner.verdict.trials import all_confirm_tails, all_confirmations, feasible_trials, top_trials

#: odds of holding the limits below this are worth saying (export, status)
ODDS_SHOWN = 0.995
#: odds of holding the limits from which a candidate counts as steady (about two standard
#: errors clear): below, its worth is its mean times odds / ODDS_STEADY, and a winner runs again
#: beside a fresh candidate; above, the noise of a few runs does not charge a steady one (a
#: charge at 0.98 moved Llama-70B picks off a steady concurrency that held 8 sets of 8)
ODDS_STEADY = 0.975


class Candidate(NamedTuple):
    """A configuration in the running for the winner."""

    trial: FrozenTrial
    runs: list[float]  # the first measurement and every confirmation's
    mean: float  # what it ranks by: the runs' mean, a run that missed on its own counted 0.0;
    # 0.0 when the runs miss their SLOs pooled
    held: int  # how many of `runs` held every SLO on their own requests
    pooled: dict[str, Any] | None  # pooled_metrics and the limits; None: no pooled verdict
    missed: list[str]  # what the pooled figures miss
    odds: float = 1.0  # that its next start holds every latency limit (verdict.tails: both odds)
    worth: float = 0.0  # what it ranks by: `mean`, less when `odds` are below ODDS_STEADY


def _pooled(t: FrozenTrial, tails: Sequence[Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The verdict on every request of the first run and the confirmation runs that kept tails,
    made when one of those did: such a run's value counts whatever its own p99s were. Without one
    (a study before tails) the runs' own verdicts stand, as they did."""
    kept = [x for x in tails if x]
    if not kept:
        return None, []
    runs = [t.user_attrs[Attr.TAILS], *kept] if t.user_attrs.get(Attr.TAILS) else kept
    pooled, missed = pooled_verdict(runs)
    return {**pooled, "limits": dict(runs[0].get("limits") or {})}, missed


def _held_alone(value: float, tails: Any) -> bool:
    """Did one confirmation run hold every SLO on its own requests? A death (0.0) did not; a run
    without tails (a study before them) was judged when it ran, and counts as it counted then."""
    if not tails:
        return value > 0.0
    return not pooled_verdict([tails])[1]


def _ranked(study: optuna.Study, final: bool = True) -> list[Candidate]:
    """The candidates (the confirmed configurations, or the best one), best first, by what a
    restart of each is worth: the mean over the first measurement and every confirmation, a run
    that missed an SLO on its own counting 0.0 (a server starts once and serves on that start's
    luck: a configuration that misses on 1 start in 4 keeps its SLOs 3 times in 4); and 0.0 for
    one whose runs miss an SLO pooled. A candidate whose runs all held, but whose p99s sit so
    near a limit that the noise may put the truth above it, ranks by its mean times its odds of
    holding over ODDS_STEADY (verdict.tails: 0.98 of a limit over 3 runs is ~0.8), read on its
    fresh starts (`_fresh`). The first measurement held on its own: it is feasible."""
    confirmations, tails = all_confirmations(study), all_confirm_tails(study)
    trials = _candidates(study, confirmations)
    every = [_tails(t, tails.get(str(t.number), [])) for t in trials]
    sd = noise_sd([log_ratios(runs) for runs in every])
    out = []
    for t, t_tails in zip(trials, every, strict=True):
        confirm = confirmations.get(str(t.number), [])
        kept = tails.get(str(t.number), [])
        runs = [t.values[0], *confirm]
        alone = [True, *(_held_alone(v, x) for v, x in zip(confirm, kept, strict=True))]
        pooled, missed = _pooled(t, kept)
        mean = (
            0.0 if missed else sum(v for v, ok in zip(runs, alone, strict=True) if ok) / len(runs)
        )
        # the p99s' distance from the limits (read on the fresh starts: `_fresh`), and the
        # requests seen beyond them on every run (a gap in the tail)
        odds = min(hold_odds(_fresh(t_tails), sd), exceed_odds(t_tails))
        # odds of ODDS_STEADY or more count as sure; below, a start is worth its share of them
        worth = min(mean, min(1.0, odds / ODDS_STEADY) * sum(runs) / len(runs))
        out.append(Candidate(t, runs, mean, sum(alone), pooled, missed, odds, worth))
    ranked = sorted(out, key=lambda c: c.worth, reverse=True)
    # the export's order; confirmation's (final=False) runs a shaky leader again instead
    return _steady_first(ranked) if final else ranked


def _steady_first(ranked: list[Candidate]) -> list[Candidate]:
    """`ranked` with the best steady candidate first when a shaky one leads it by no more than
    the run-to-run noise (twice the standard error of the two means, as `versus_runner_up`
    separates them): a lead the runs cannot tell from luck does not buy a start that misses its
    limits more often. Llama-70B TP4: concurrency 65 worth 1,356 (odds 0.94 on six fresh starts,
    55 of 60 starts hold) against a steady 1,310 at 55 (60 of 60).

    For the export only, once confirmation is spent: while it runs, a shaky leader is run again
    (`unsettled`, `budget.confirm_shaky`), and its next starts say more than the rule. Applied
    there, it set aside leaders one or two starts from steady: Llama-8B on 32 GB, an unconfirmed
    1,769 for a steady 1,690 (0.953 of the optimum on held-out starts, where the 1,769 confirmed
    read 0.986); Llama-70B, 1,364 on one fresh start at 0.93 of its limit for a steady 1,270."""
    best = ranked[0] if ranked else None
    cv = _noise_cv(ranked)
    if best is None or not _shaky(best) or not best.worth or cv is None:
        return ranked
    steady = next((c for c in ranked[1:] if not _shaky(c) and c.worth > 0), None)
    if steady is None:
        return ranked
    gap = (best.worth - steady.worth) / best.worth
    if gap > 2 * cv * (1 / len(best.runs) + 1 / len(steady.runs)) ** 0.5:
        return ranked
    return [steady, *(c for c in ranked if c is not steady)]


def _fresh(every: Sequence[Any]) -> Sequence[Any]:
    """The runs whose p99s say how far a candidate's next start lies from its limits: its
    confirmation runs once one kept tails, else its first measurement. The first measurement is
    the run that made it a candidate, chosen for holding its limits (the inner search's highest
    point clear of them, the best of many trials near an edge): where p99s scatter by a few %
    from start to start, the one chosen is a lucky draw. Llama-8B on 32 GB: the winners' first
    runs read 0.015 (in log p99) further from the TTFT limit than their confirmations, on
    average over 13; at concurrency 80, runs at -0.052 and -0.053 gave odds of 0.98, while 20
    fresh starts average -0.025 and 2 in 20 miss. A confirmation run is a fresh start drawn
    without that choice."""
    return every[1:] if any(every[1:]) else every


def _candidates(study: optuna.Study, confirmations: Mapping[str, Any]) -> list[FrozenTrial]:
    """The best trials by value, as many as were confirmed (at least one), and every confirmed
    one besides: a fallback confirmed from deeper in the list (`unsettled`) stays a candidate."""
    top = top_trials(study, max(len(confirmations), 1))
    numbers = {t.number for t in top}
    extra = [
        t
        for t in feasible_trials(study)
        if str(t.number) in confirmations and t.number not in numbers
    ]
    return [*top, *extra]


def _tails(t: FrozenTrial, kept: Sequence[Any]) -> list[Any]:
    """Every run's tails of a candidate: its first measurement's, then its confirmations'."""
    return [t.user_attrs.get(Attr.TAILS), *kept]


def best_trial(study: optuna.Study) -> tuple[FrozenTrial | None, dict[str, Any]]:
    """The winner: highest mean of first measurement and confirmations, among those that hold
    their SLOs pooled over their runs; with the spread, and the pooled figures when judged so
    (`pooled`, `pooled_missed`: not empty only when every candidate missed)."""
    ranked = _ranked(study)
    if not ranked:
        return None, {}
    best, runs, mean, held, pooled, missed, odds, _ = ranked[0]
    measured = sum(runs) / len(runs)  # the spread is of the runs as measured, misses included
    spread = 100 * (max(runs) - min(runs)) / measured if mean and measured else 0.0
    summary: dict[str, Any] = {"mean": mean, "runs": runs, "held": held, "spread_pct": spread}
    if odds < ODDS_SHOWN:
        summary["hold_odds"] = odds
    if pooled is not None:
        summary.update(pooled=pooled, pooled_missed=missed)
    return best, summary


def held_note(summary: Mapping[str, Any]) -> str:
    """ ", 3 of 4 runs held the SLOs on their own (a miss counts 0)" when one did not, and
    ", odds 0.88 a fresh start holds its latency limits" when it is unsure; else ""."""
    runs, held = len(summary.get("runs") or ()), summary.get("held")
    note = ""
    if held is not None and held < runs:
        note = f", {held} of {runs} runs held the SLOs on their own (a miss counts 0)"
    if (odds := summary.get("hold_odds")) is not None:
        note += f", odds {odds:.2f} a fresh start holds its latency limits"
    return note


def versus_runner_up(study: optuna.Study) -> dict[str, Any] | None:
    """How far the winner's mean is ahead of the runner-up's, against the run-to-run noise.

    The noise is the relative standard deviation pooled over every candidate with two runs or
    more (one configuration's runs differ by a few %: bench_search's noise table), each about its
    runs' own mean (a candidate ranked 0.0 for a pooled miss still measured its throughput); the
    gap is real ("separated") when it exceeds twice the standard error of the difference of the
    two means (~95%). None with fewer than two candidates; `separated` None when no candidate ran
    twice (nothing to judge the noise by).
    """
    ranked = _ranked(study)
    if len(ranked) < 2:
        return None
    winner, second = ranked[0], ranked[1]
    w_mean, r_mean = winner.worth, second.worth  # as ranked: the odds of holding count
    cv = _noise_cv(ranked)
    gap = 100 * (w_mean - r_mean) / w_mean if w_mean else 0.0
    out: dict[str, Any] = {
        "runner_up": second.trial.number,
        "runner_up_mean": second.mean,
        "gap_pct": gap,
    }
    if second.odds < ODDS_SHOWN:
        out["runner_up_odds"] = second.odds
        out["runner_up_worth"] = r_mean  # its mean charged by its odds: what gap_pct compares
    if second.missed:  # ranked 0.0: out of the running, whatever the noise
        out["runner_up_missed"] = second.missed
    if gap < 0:  # ahead by worth, behind on steadiness (`_steady_first`)
        out["steadier"] = True
    if cv is None:
        return {**out, "noise_pct": None, "two_sigma_pct": None, "separated": None}
    two_sigma = 200 * cv * (1 / len(winner.runs) + 1 / len(second.runs)) ** 0.5
    return {**out, "noise_pct": 100 * cv, "two_sigma_pct": two_sigma, "separated": gap > two_sigma}


def _noise_cv(ranked: Sequence[Candidate]) -> float | None:
    """The run-to-run noise: the relative standard deviation pooled over every candidate with
    two runs or more, each about its own runs' mean; None when none ran twice."""
    squares, dof = 0.0, 0
    for c in ranked:
        mean = sum(c.runs) / len(c.runs)
        if len(c.runs) > 1 and mean > 0:
            squares += sum(((x - mean) / mean) ** 2 for x in c.runs)
            dof += len(c.runs) - 1
    return None if dof == 0 else (squares / dof) ** 0.5


def out_of_reach(study: optuna.Study) -> set[int]:
    """The candidates more confirmation runs cannot make the winner: each trails a steady
    winner (not `_shaky`) by more than twice the standard error of the two means at the noise
    measured, as `versus_runner_up` separates a runner-up. Empty while the winner is shaky (its
    fallbacks may be needed) or no candidate ran twice (no noise to judge by)."""
    ranked = _ranked(study, final=False)
    if len(ranked) < 2 or _shaky(ranked[0]) or not ranked[0].worth:
        return set()
    cv = _noise_cv(ranked)
    if cv is None:
        return set()
    best = ranked[0]
    out = set()
    for c in ranked[1:]:
        gap = (best.worth - c.worth) / best.worth
        if gap > 2 * cv * (1 / len(best.runs) + 1 / len(c.runs)) ** 0.5:
            out.add(c.trial.number)
    return out


def unsettled(study: optuna.Study, rounds_left: int | None = None) -> tuple[int, ...]:
    """The trials confirmation runs once more, () when settled: while a run of the winner missed
    an SLO on its own, or its odds of holding them are below ODDS_STEADY, the winner and the
    best configuration not yet confirmed (every candidate confirmed may be as shaky: the next
    one may be the steady one); else the winner alone while
    its pooled p99 holds a limit by less than SLO_MARGIN; else the runner-up alone while its mean
    beats the winner but its odds are below ODDS_STEADY; else winner and runner-up while the gap
    between them is inside the noise, unless `rounds_left` more runs of each could not separate
    that gap at the noise measured (`_futile`): then they are as good as each other."""
    ranked = _ranked(study, final=False)
    # a winner that misses pooled means every candidate did: no lead to settle
    if not ranked or ranked[0].missed:
        return ()
    best = ranked[0]
    # a runner-up that out-earns the winner but for its odds: one more start sharpens them
    # either way
    held_back = [
        c for c in ranked[1:2] if c.odds < ODDS_STEADY and c.mean > best.worth and not c.missed
    ]
    if _shaky(best):
        # beside it, that runner-up when it was confirmed once (its odds read on one start: its
        # p99 must sit ~6% clear to read steady), else a configuration not yet confirmed (two
        # shaky ones at the same edge, each run again in turn, never leave it)
        once = [c.trial for c in held_back if len(c.runs) == 2]
        other = once or _fallback(study, ranked)
        return (best.trial.number, *(t.number for t in other))
    if best.pooled and near_limits(best.pooled):
        return (best.trial.number,)
    if held_back:
        return (held_back[0].trial.number,)
    versus = versus_runner_up(study)
    # tied with no noise (a plateau measured exactly) is as settled as separated
    if versus is None or versus["separated"] is not False or not versus["noise_pct"]:
        return ()
    runs = len(best.runs), len(ranked[1].runs)  # versus_runner_up's runner-up is ranked[1]
    if rounds_left is not None and _futile(versus, runs, rounds_left):
        return ()
    return (best.trial.number, versus["runner_up"])


def shaky_winner(study: optuna.Study) -> bool:
    """Is the winner shaky (`_shaky`) with a steadier candidate possibly to find: False when
    there is no winner or every candidate misses pooled (nothing to settle)."""
    ranked = _ranked(study, final=False)
    return bool(ranked) and not ranked[0].missed and _shaky(ranked[0])


def _futile(versus: Mapping[str, Any], runs: tuple[int, int], rounds: int) -> bool:
    """The gap would still be inside the noise after `rounds` more runs of winner and runner-up:
    twice the standard error of the two means, at the noise measured, with that many more runs
    each. Kimi TP8: HiCache on and off 2% apart with ~2% noise a start need ~8 runs each to
    part; two more rounds after three runs cost 4 restarts and part nothing."""
    n, m = runs
    now, then = 1 / n + 1 / m, 1 / (n + rounds) + 1 / (m + rounds)
    return versus["gap_pct"] <= versus["two_sigma_pct"] * (then / now) ** 0.5


def _shaky(c: Candidate) -> bool:
    """A run of it missed an SLO alone, its runs miss one pooled, or its odds are not steady."""
    return bool(c.missed) or c.held < len(c.runs) or c.odds < ODDS_STEADY


def _fallback(study: optuna.Study, ranked: Sequence[Candidate]) -> list[FrozenTrial]:
    """The best configuration not yet a candidate, to confirm beside a shaky winner: one served
    at less client load (concurrency, else request rate) than every shaky candidate when the
    study has one. The next by value is mostly one more lucky draw at the same SLO edge (the
    demo: four trials at concurrency 166, each confirmed and found shaky in turn, while 152 held
    by 10%); latency tails grow with the queue, so a notch less load is the way off an edge.
    "Best" is by value charged by the odds of its one run (as `_ranked` charges a candidate):
    below an edge, p99s need not fall with load (Llama-70B TP4: p99 TPOT at concurrency 62 sits
    above 65's), and the fastest trial there may sit at the limit too, while one 1% slower
    holds by 7%. That run is read as far from its limits as the candidates' fresh starts read
    from their first runs (`first_bias`): a first run 6% under a limit is a lucky draw where
    they read 3% under, and confirming it finds one more shaky candidate."""
    taken = {canonical(c.trial.params) for c in ranked}
    tails = all_confirm_tails(study)
    every = [_tails(c.trial, tails.get(str(c.trial.number), [])) for c in ranked]
    sd, bias = noise_sd([log_ratios(x) for x in every]), first_bias(every)
    rest = sorted(
        (
            t
            for t in top_trials(study, len(feasible_trials(study)))
            if canonical(t.params) not in taken
        ),
        key=lambda t: _first_worth(t, sd, bias),
        reverse=True,
    )
    edges = [_load_level(c.trial) for c in ranked if _shaky(c)]
    if edges and all(e is not None for e in edges):
        edge = min(e for e in edges if e is not None)  # every one, as checked (for the types)
        lower = [t for t in rest if (c := _load_level(t)) is not None and c < edge]
        if lower:
            return lower[:1]
    return rest[:1]


def _first_worth(t: FrozenTrial, sd: Mapping[str, float], bias: Mapping[str, float]) -> float:
    """A trial's value charged by the odds of holding its limits read on its one run, that run
    moved toward its limits by the first runs' measured `bias`."""
    tails = [t.user_attrs.get(Attr.TAILS)]
    odds = min(hold_odds(tails, sd, bias), exceed_odds(tails))
    return t.values[0] * min(1.0, odds / ODDS_STEADY)


def _load_level(t: FrozenTrial) -> float | None:
    """The client load a trial served: its concurrency (its inner search's or its param), else
    its request rate; None when the study fixes both."""
    params = full_params(t.params, t.user_attrs)
    for name in ("concurrency", "request-rate"):
        if isinstance(params.get(name), int | float):
            return float(params[name])
    return None
