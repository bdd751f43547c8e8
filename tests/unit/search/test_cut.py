"""The early stop of a load run (search/cut.py): when a run may be judged, and that it is cut
only when even its optimistic projection cannot beat the target."""

from __future__ import annotations

import random

import pytest

from tuner.loadgen.result import LoadProgress
from tuner.search.cut import CUT_METRIC, DRIFT, NOISE, Cutter, cutter

WINDOW = 300.0


def ticks(rate: float, streams: int, life_s: float, prefill_s: float = 8.0, later: float = 1.0):
    """A closed loop's progress once a second: nothing during the first prefill, then `rate`
    tok/s (x `later` over the second half of the window); every stream ends a request each
    `life_s` seconds and starts the next at once."""
    tokens = 0.0
    for t in range(1, int(WINDOW) + 1):
        if t > prefill_s:
            tokens += rate * (later if t > WINDOW / 2 else 1.0)
        done = 0 if t < prefill_s + life_s else streams * int((t - prefill_s) // life_s)
        streaming = streams if t > prefill_s else 0
        yield LoadProgress(float(t), WINDOW, done, 10_000, int(tokens), streaming)


def first_cut(rule: Cutter, progress) -> float | None:
    for p in progress:
        if rule.cut(p) is not None:
            return p.elapsed_s
    return None


def test_a_run_clearly_below_the_target_is_cut_once_past_its_ramp() -> None:
    rule = Cutter(target=1000.0, window_s=WINDOW, concurrency=32)
    at = first_cut(rule, ticks(rate=600.0, streams=32, life_s=40.0))
    # the batch is full at 9 s; the rate must span a turnover of it (requests end at 48 s,
    # then 88 s); a fifth of the window (60 s) must have gone
    assert at is not None and 60.0 <= at <= 100.0
    assert rule.projected == pytest.approx(600.0 * (WINDOW - 8) / WINDOW, rel=0.02)
    assert rule.at_s == at


def test_a_run_that_could_still_beat_the_target_runs_its_window() -> None:
    rule = Cutter(target=1000.0, window_s=WINDOW, concurrency=32)
    # at 0.96 of the target it is within the noise of it: never cut, even at the end
    assert first_cut(rule, ticks(rate=960.0 * WINDOW / (WINDOW - 8), streams=32, life_s=40)) is None


def test_nothing_is_judged_before_a_batch_turned_over() -> None:
    """Streams whose first requests never end within the window (a life longer than it):
    the rate so far is the first wave's alone, and the run is never cut, however low."""
    rule = Cutter(target=1000.0, window_s=WINDOW, concurrency=64)
    assert first_cut(rule, ticks(rate=100.0, streams=64, life_s=400.0)) is None
    assert rule.projected is None


def test_a_pool_that_admits_fewer_than_the_streams_counts_its_own_batch() -> None:
    """128 streams, 40 running at once (the rest queue): the batch is full once 40 ended."""
    rule = Cutter(target=1000.0, window_s=WINDOW, concurrency=128)
    at = first_cut(rule, ticks(rate=500.0, streams=40, life_s=30.0))
    assert at is not None and at < WINDOW / 2


@pytest.mark.parametrize("seed", range(20))
def test_a_run_whose_final_score_beats_the_target_is_never_cut(seed: int) -> None:
    """Whatever the rest of the window does within DRIFT of the rate seen, a run that ends
    above the target (less the noise) is never cut."""
    rng = random.Random(seed)
    later = rng.uniform(1.0, 1 + DRIFT)  # the second half runs faster, up to DRIFT
    rate = rng.uniform(200.0, 2000.0)
    life = rng.uniform(10.0, 100.0)
    progress = list(ticks(rate, 16, life, later=later))
    final = progress[-1].output_tokens / WINDOW
    rule = Cutter(target=final * (1 + NOISE) * 0.999, window_s=WINDOW, concurrency=16)
    assert first_cut(rule, progress) is None, (rate, life, later)


def test_only_a_windowed_throughput_with_something_to_beat_is_cut() -> None:
    assert cutter(CUT_METRIC, 300, 32, 900.0) is not None
    assert cutter("goodput", 300, 32, 900.0) is None  # the progress does not count it
    assert cutter(CUT_METRIC, None, 32, 900.0) is None  # a run bounded by its request count
    assert cutter(CUT_METRIC, 300, 32, None) is None  # nothing measured yet
    assert cutter(CUT_METRIC, 300, 32, 0.0) is None


def _waits(t: float, fast: int, slow: int, limit_s: float) -> LoadProgress:
    """32 streams 100 s into a 300 s window, past a turnover; `slow` requests beyond the limit."""
    waits = (0.5,) * fast + (limit_s * 1.5,) * slow
    return LoadProgress(
        t,
        WINDOW,
        done=len(waits) - 32,
        planned=10_000,
        output_tokens=50_000,
        streaming=32,
        first_waits=waits,
    )


def test_a_run_whose_p99_ttft_already_missed_is_cut_as_a_miss() -> None:
    # no score to beat (the study's first server): only the limit can cut
    rule = cutter("goodput", WINDOW, 32, None, ttft_limit_ms=8000)
    assert rule is not None and rule.target is None
    # 200 requests started in 100 s, 168 ended: the slots turned over (168 + 32) / 100 = 2 a
    # second, the rest of the window may start 4x that: at most 200 + 2 x 4 x 200 + 32 = 1,832
    # requests; 1% of that is 18.3
    assert rule.cut(_waits(100.0, fast=181, slow=19, limit_s=8.0)) is None
    why = rule.cut(_waits(100.0, fast=180, slow=20, limit_s=8.0))
    assert why is not None and "misses the limit" in why and rule.at_s == 100.0
    assert rule.projected == 500.0  # no projection yet: the rate so far, 50,000 tokens in 100 s


def test_a_queue_past_the_pool_is_cut_before_its_batch_turns_over() -> None:
    """150 streams on a pool that runs 40: 110 wait beyond the 30 s limit at 40 s of a 90 s
    window and none has ended. No score projection is possible yet (no turnover), the TTFT
    miss is: the window counts at most 150 + 150/40 x 4 x 50 + 150 = 1,050 requests."""
    rule = cutter(CUT_METRIC, 90.0, 150, 1_000.0, ttft_limit_ms=30_000)
    assert rule is not None
    waits = (2.0,) * 40 + (40.0,) * 110
    at_40 = LoadProgress(40.0, 90.0, 0, 10_000, 20_000, 40, first_waits=waits)
    assert rule.project(at_40) is None
    why = rule.cut(at_40)
    assert why is not None and "110 requests waited beyond" in why
    # the same queue 25 s in, 4 of them past the limit: a fast rest could still dilute them
    early = LoadProgress(25.0, 90.0, 0, 10_000, 9_000, 40, first_waits=(2.0,) * 146 + (31.0,) * 4)
    assert cutter(CUT_METRIC, 90.0, 150, 1_000.0, ttft_limit_ms=30_000).cut(early) is None


def test_a_run_within_its_ttft_limit_is_not_cut_for_it() -> None:
    rule = cutter(CUT_METRIC, WINDOW, 32, 100.0, ttft_limit_ms=8000)  # and beats the score
    assert rule is not None
    rule.full = (10.0, 1_000, 0, 32)
    assert rule.cut(_waits(100.0, fast=200, slow=0, limit_s=8.0)) is None
