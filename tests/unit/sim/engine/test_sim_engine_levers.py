"""The engine's two levers: speculative decoding (accept lengths, tokens in chunks, the KV it
keeps, the decode log) and DP attention (groups in lockstep, round robin, per-group caps)."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

import pytest

from tests.unit.sim.engine.test_sim_engine import (
    BPT,
    TIMING,
    decode_field,
    drive,
    unique_requests,
)
from tuner.sim.engine import (
    DPEngine,
    Engine,
    EngineParams,
    SpecParams,
    StepTimeModel,
    new_engine,
    run_closed_loop,
)
from tuner.sim.engine.spec import SpecSampler
from tuner.sim.engine.timing import DECODE, Work

CHAT = (0.75, 0.68, 0.62)
SPEC = SpecParams(
    num_steps=3,
    topk=1,
    num_draft_tokens=4,
    accept=CHAT,
    decode_reserve=7,
    draft_weights_gib=0.5,
    draft_bytes_per_token=1152,
)
QUIET = replace(TIMING, noise_run_pct=0.0, noise_step_pct=0.0)


def expected_length(accept: tuple[float, ...]) -> float:
    """E[accept length] = 1 + p1 + p1 p2 + ... (the chain of the acceptance model)."""
    total, survive = 1.0, 1.0
    for p in accept:
        survive *= p
        total += survive
    return total


# --- speculative decoding -------------------------------------------------------------------


def test_accept_lengths_follow_the_acceptance_model():
    s = SpecSampler(CHAT, 4, False, random.Random(3))
    draws = [s.draw() for _ in range(40_000)]
    assert set(draws) == {1, 2, 3, 4}
    assert statistics.mean(draws) == pytest.approx(expected_length(CHAT), abs=0.02)
    assert draws.count(4) / len(draws) == pytest.approx(0.75 * 0.68 * 0.62, abs=0.01)
    again = SpecSampler(CHAT, 4, False, random.Random(3))
    assert [again.draw() for _ in range(1000)] == draws[:1000]  # seeded


def test_accept_rate_per_version():
    """0.5.6.post2: accepted tokens (bonus included) / (forwards x draft tokens); 0.5.23:
    correct drafts / (forwards x (draft tokens - 1)) (tests/fidelity/test_levers_fidelity.py)."""
    old = SpecSampler(CHAT, 4, False, random.Random(0))
    new = SpecSampler(CHAT, 4, True, random.Random(0))
    for s in (old, new):
        s.record(10, 25)  # 10 requests kept 25 tokens: 15 correct drafts
    assert old.log() == (2.5, 25 / 40)
    assert new.log() == (2.5, 15 / 30)
    assert old.average == 2.5 and old.log() == (0.0, 0.0)


def test_speculative_engine_writes_tokens_in_chunks_and_keeps_their_kv():
    params = EngineParams(max_total_tokens=100_000, max_running_requests=48, spec=SPEC)
    reqs = unique_requests(40, 200, 400, 50, 120)
    res = run_closed_loop(params, QUIET, BPT, reqs, 8, seed=2)
    assert [r.completion_tokens for r in res] == [r.max_new_tokens for r in reqs]
    for r in res:
        steps = len(set(r.token_times_s))
        assert steps < r.completion_tokens  # several tokens a step
        assert r.completion_tokens / steps <= 4
    eng = Engine(params, QUIET, BPT, seed=2)
    logs, gen = drive(eng, reqs, 8)
    assert gen == sum(r.max_new_tokens for r in reqs)
    assert eng.pool.used() == 0 and eng.pool.private == 0  # every kept token's slot returned
    lengths = decode_field(logs, "accept len")
    assert lengths and statistics.mean(lengths) == pytest.approx(expected_length(CHAT), abs=0.25)
    assert eng.stats().avg_spec_accept_length == pytest.approx(statistics.mean(lengths), rel=0.1)


def test_speculation_needs_its_reserve_free_to_decode():
    """A decode step needs `decode_reserve` free slots a request: at a nearly full pool the
    speculative engine retracts where the plain one still decodes."""
    plain = EngineParams(max_total_tokens=3_000, max_running_requests=64)
    spec = replace(plain, spec=replace(SPEC, decode_reserve=40))
    reqs = unique_requests(10, 240, 250, 40, 40)
    a = Engine(plain, QUIET, BPT)
    b = Engine(spec, QUIET, BPT)
    drive(a, reqs, 10)
    drive(b, reqs, 10)
    assert a.stats().retracted_reqs_total == 0 < b.stats().retracted_reqs_total


def test_speculation_wins_at_small_batch_and_loses_at_large():
    """From the step-time model alone (no scheduler): a draft-and-verify iteration costs more
    than a decode step, more so as the batch grows, and yields the accept length."""
    t = replace(QUIET, bytes_per_token=BPT)
    length = expected_length(CHAT)

    def gain(bs: int) -> float:
        kv = bs * 600
        plain = bs / t.decode_s(bs, kv)
        spec = bs * length / t.spec_decode_s(bs, kv, True, SPEC)
        return spec / plain

    assert gain(1) > 1.5 and gain(8) > 1.2
    assert gain(512) < 1.0


# --- DP attention ---------------------------------------------------------------------------


def dp_params(groups: int, tokens: int = 30_000, **kw) -> EngineParams:
    return EngineParams(
        max_total_tokens=tokens, max_running_requests=512, dp_groups=groups, attn_tp=1, **kw
    )


def test_new_engine_picks_dp_groups():
    assert isinstance(new_engine(dp_params(1), QUIET, BPT), Engine)
    eng = new_engine(dp_params(4), QUIET, BPT)
    assert isinstance(eng, DPEngine) and len(eng.groups) == 4


def test_round_robin_dispatch_and_lockstep():
    """Requests go round robin (0.5.6.post2 data_parallel_controller.py:471-484); every group
    steps together: one clock."""
    eng = DPEngine(dp_params(4), QUIET, BPT)
    reqs = unique_requests(12, 100, 200, 20, 40)
    for i, r in enumerate(reqs):
        eng.add_request(str(i), r.input_ids, r.max_new_tokens)
    assert [len(g._s.waiting) for g in eng.groups] == [3, 3, 3, 3]
    assert eng.stats().num_queue_reqs == 12
    steps = 0
    while eng.has_work():
        step = eng.step()
        steps += 1
        assert {g._s.clock for g in eng.groups} == {eng.clock_s}
        assert len(step.log_lines) == len(step.log_groups)
    assert eng.stats().generation_tokens_total == sum(r.max_new_tokens for r in reqs)
    eng.add_request("x", (1, 2), 4)
    with pytest.raises(ValueError, match="duplicate"):
        eng.add_request("x", (1, 2), 4)


def test_dp_attention_runs_d_times_the_requests_of_one_pool():
    """A pool-bound load: each group holds as many requests as one scheduler with the same
    per-GPU pool, so D groups run ~D times as many (MLA: no replica of their KV elsewhere)."""
    reqs = unique_requests(800, 1000, 2500, 500, 1500)

    def running(groups: int) -> float:
        eng = new_engine(dp_params(groups, tokens=40_000), TIMING, BPT, seed=1)
        nxt = 400
        for i in range(nxt):
            eng.add_request(str(i), reqs[i].input_ids, reqs[i].max_new_tokens)
        seen = []
        while eng.clock_s < 120 and eng.has_work():
            _, out = eng.advance()
            for _ in out.finished:
                r = reqs[nxt % len(reqs)]
                eng.add_request(str(nxt), r.input_ids, r.max_new_tokens)
                nxt += 1
            if eng.clock_s > 60:
                seen.append(eng.stats().num_running_reqs)
        return statistics.mean(seen)

    one, eight = running(1), running(8)
    print(f"running: 1 group {one:.1f}, 8 groups {eight:.1f}")
    assert 6.5 <= eight / one <= 8.5, (one, eight)


def test_dp_step_is_the_slowest_group_plus_the_shared_part():
    t = replace(QUIET, bytes_per_token=BPT, dp_fixed_ms=1.0, dp_gather_us_per_token=4.0)
    balanced = [Work(DECODE, 8, kv=8 * 2000) for _ in range(8)]
    skewed = [Work(DECODE, 64, kv=64 * 2000)] + [Work(0) for _ in range(7)]
    # the same 64 requests: one group doing all attention is slower than eight in parallel
    assert t.dp_step_s(skewed, 8, 0.0) > t.dp_step_s(balanced, 8, 0.0)
    # one group, no extra weights: a plain decode step plus the sync and the gather
    one = t.dp_step_s([Work(DECODE, 8, kv=16_000)], 1, 0.0)
    assert one == pytest.approx(t.decode_s(8, 16_000) + 1e-3 + 8 * 4e-6)
    # replicated attention weights are read every step
    assert t.dp_step_s(balanced, 8, 8.55) > t.dp_step_s(balanced, 8, 0.0)


def test_dp_groups_cap_their_own_running_requests():
    eng = DPEngine(replace(dp_params(2), max_running_requests=3), QUIET, BPT)
    for i, r in enumerate(unique_requests(20, 100, 120, 30, 30)):
        eng.add_request(str(i), r.input_ids, r.max_new_tokens)
    peak = 0
    while eng.has_work():
        eng.step()
        peak = max(peak, *(len(g._s.running) for g in eng.groups))
    assert peak == 3


def test_dp_engine_is_deterministic_and_speculates_per_group():
    params = dp_params(4, spec=SPEC)
    reqs = unique_requests(60, 200, 400, 50, 120)
    a = run_closed_loop(params, TIMING, BPT, reqs, 16, seed=5)
    b = run_closed_loop(params, TIMING, BPT, reqs, 16, seed=5)
    assert a == b
    assert [r.completion_tokens for r in a] == [r.max_new_tokens for r in reqs]


def test_dp_timing_keys_parse():
    t = StepTimeModel.from_mapping({"attn_compute_share": 0.25, "dp_gather_us_per_token": 4.4})
    assert t.attn_compute_share == 0.25
    with pytest.raises(Exception, match="fraction"):
        StepTimeModel.from_mapping({"attn_compute_share": 1.5})
