"""The odds that a configuration holds its latency limits, from its runs' p99s and from the
requests beyond them (verdict/tails.py)."""

from __future__ import annotations

import math

import pytest

from tuner.verdict.tails import (
    FLOOR_SD,
    _gamma_cdf,
    exceed_odds,
    first_bias,
    histogram,
    hold_odds,
    log_ratios,
    noise_sd,
)

LIMITS = {"p99_ttft_ms": 3000.0, "max_error_rate": 0.01}


def _run(p99_ms: float, n: int = 500) -> dict:
    """One run's tails whose p99 TTFT is about p99_ms: n requests, 2% of them at p99_ms."""
    slow = n // 50
    values = [0.5 * p99_ms / 1000] * (n - slow) + [p99_ms / 1000] * slow
    return {"limits": LIMITS, "ended": n, "errors": 0, "bins": {"p99_ttft_ms": histogram(values)}}


def test_log_ratios_are_per_run_and_skip_deaths_and_the_error_rate() -> None:
    logs = log_ratios([_run(2700), None, _run(3300)])
    assert list(logs) == ["p99_ttft_ms"]  # max_error_rate is not a latency
    ratios = [math.exp(y) for y in logs["p99_ttft_ms"]]
    assert ratios == [pytest.approx(0.9, rel=0.01), pytest.approx(1.1, rel=0.01)]


def test_the_noise_is_pooled_over_repeats_and_never_below_the_floor() -> None:
    # repeats that happen to agree do not make an edge look safe
    agreeing = log_ratios([_run(2940), _run(2940), _run(2940)])
    assert noise_sd([agreeing]) == {"p99_ttft_ms": FLOOR_SD}
    # one configuration's p99s 10% apart: that spread is the noise (one run alone says nothing)
    spread = log_ratios([_run(2600), _run(2900)])
    alone = log_ratios([_run(1000)])
    sd = noise_sd([spread, alone])["p99_ttft_ms"]
    assert sd == pytest.approx(math.log(2900 / 2600) / math.sqrt(2), rel=0.02)
    assert noise_sd([alone]) == {"p99_ttft_ms": FLOOR_SD}


def test_odds_fall_as_the_pooled_p99_nears_the_limit_and_rise_with_runs() -> None:
    sd = {"p99_ttft_ms": FLOOR_SD}
    far, edge, over = (hold_odds([_run(ms)] * 3, sd) for ms in (2700, 2950, 3060))
    assert far > 0.999 and 0.7 < edge < 0.85 and over < 0.3
    # the same p99 measured on more starts is known better: surer of holding
    assert hold_odds([_run(2950)] * 8, sd) > edge
    # ... but never surer than the next start's own noise allows: the odds are the next
    # start's, not the mean's (which reach 1 with runs enough): 2,950 of 3,000 pooled is
    # 0.85 sd of one start below the limit, and 1 start in 5 misses however often it ran
    many = hold_odds([_run(2950)] * 400, sd)
    assert edge < many < 0.82
    assert hold_odds([_run(2950)] * 8, sd) > edge
    # more noise, less sure
    assert hold_odds([_run(2950)] * 3, {"p99_ttft_ms": 2 * FLOOR_SD}) < edge
    # nothing measured (deaths only, a study before tails): nothing to doubt
    assert hold_odds([None, None], sd) == 1.0


def _gapped(beyond: int, n: int = 297, limit_ms: float = 30000.0) -> dict:
    """One run's TTFT tails with a gap, as Kimi TP8 at concurrency 62 has on every start: n
    requests, `beyond` of them (the opening burst the pool could not admit) at 71 s, the rest
    spread up to 22 s."""
    values = [22.0 * (i + 1) / (n - beyond) for i in range(n - beyond)] + [71.0] * beyond
    limits = {"p99_ttft_ms": limit_ms, "max_error_rate": 0.01}
    return {"limits": limits, "ended": n, "errors": 0, "bins": {"p99_ttft_ms": histogram(values)}}


def test_a_gap_in_the_tail_that_the_p99s_hide_is_counted() -> None:
    runs = [_gapped(3)] * 3  # 9 of 891 beyond the limit: 1.01%
    # each run's p99 interpolates a few % into the gap: 0.8 of the limit, "safe" by its p99s
    assert all(math.exp(y) < 0.85 for y in log_ratios(runs)["p99_ttft_ms"])
    assert hold_odds(runs, {"p99_ttft_ms": FLOOR_SD}) > 0.999
    assert exceed_odds(runs) < 0.5  # more likely over 1% than under
    assert exceed_odds(runs * 5) < exceed_odds(runs)  # the same share, more surely over
    # 4 of 297 beyond is surer over 1% than 3; no more than 1% beyond (2 of 297, 1 of 104,
    # none): its p99 holds over any number of runs pooled, and hold_odds judges the bulk
    assert exceed_odds([_gapped(4)]) < exceed_odds([_gapped(3)]) < 0.5
    assert exceed_odds([_gapped(2)]) == exceed_odds([_gapped(1, n=104)] * 5) == 1.0
    assert exceed_odds([_gapped(0)]) == 1.0 and exceed_odds([None]) == 1.0
    # a limit above the gap: nothing beyond it
    assert exceed_odds([_gapped(3, limit_ms=80000.0)]) == 1.0


def test_the_gamma_cdf_matches_closed_forms_and_its_large_argument_form() -> None:
    # shape 1/2: erf(sqrt(x)); shape 1: 1 - exp(-x); then the cube-root form past the series
    for x in (0.1, 2.0, 9.0):
        assert _gamma_cdf(0.5, x) == pytest.approx(math.erf(math.sqrt(x)), abs=1e-9)
        assert _gamma_cdf(1.0, x) == pytest.approx(1 - math.exp(-x), abs=1e-9)
    assert _gamma_cdf(99.5, 99.5) == pytest.approx(_gamma_cdf(100.5, 100.5), abs=0.03)
    assert 0.45 < _gamma_cdf(5000.5, 5000.0) < 0.5 and _gamma_cdf(3.5, 600.0) == 1.0
    assert _gamma_cdf(2.0, 0.0) == 0.0


def test_first_bias_is_how_far_first_runs_read_below_their_fresh_starts() -> None:
    # two candidates: first runs at 0.90 and 0.92 of the limit, fresh starts at 0.96 and 0.97
    lucky = [[_run(2700), _run(2880), _run(2880)], [_run(2760), _run(2910)]]
    y = {ms: log_ratios([_run(ms)])["p99_ttft_ms"][0] for ms in (2700, 2760, 2880, 2910)}
    want = (y[2880] - y[2700] + y[2910] - y[2760]) / 2  # ~0.055: the p99s as binned
    assert first_bias(lucky)["p99_ttft_ms"] == pytest.approx(want)
    # a candidate with no fresh start, or no first tails (a study before them), says nothing
    assert first_bias([[_run(2700)], [None, _run(2900)]]) == {}
    # first runs no luckier than the fresh ones: no bias, never a credit
    assert first_bias([[_run(2900), _run(2700)]]) == {"p99_ttft_ms": 0.0}


def test_a_shift_moves_the_runs_toward_their_limit() -> None:
    sd = {"p99_ttft_ms": FLOOR_SD}
    run = [_run(2800)]  # one run 7% under the limit: steady on its own
    assert hold_odds(run, sd) > 0.975
    y = {ms: log_ratios([_run(ms)])["p99_ttft_ms"][0] for ms in (2800, 2950)}
    shifted = hold_odds(run, sd, {"p99_ttft_ms": y[2950] - y[2800]})
    assert shifted == pytest.approx(hold_odds([_run(2950)], sd)) and shifted < 0.8
