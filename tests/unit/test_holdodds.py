"""The odds that a configuration holds its latency limits, from its runs' p99s (holdodds.py)."""

from __future__ import annotations

import math

import pytest

from tuner.holdodds import FLOOR_SD, hold_odds, log_ratios, noise_sd
from tuner.pooled import histogram

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
