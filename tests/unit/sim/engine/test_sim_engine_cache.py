"""The simulator's prefix cache and HiCache host tier (tuner/sim/engine/radix.py through the Engine)."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

import pytest

from tuner.sim.engine import Engine, EngineParams, SimRequest, StepTimeModel, run_closed_loop
from tuner.sim.engine.radix import RadixCache, block_size, chain_keys
from tuner.sim.profile import load_profile

BPT = 70_272
KIMI = replace(
    StepTimeModel.from_mapping(load_profile("kimi-k2.5-tp8").timing),
    noise_run_pct=0.0,
    noise_step_pct=0.0,
)


def ids(seed: int, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(1000, 101000) for _ in range(n))


def shared_prefix_workload(groups: int, prefix: int, question: int, out: int, n: int, burst=1):
    """`n` requests cycling over `groups` system prompts, `burst` in a row per prompt."""
    prefixes = [ids(10_000 + g, prefix) for g in range(groups)]
    return [SimRequest(prefixes[i // burst % groups] + ids(i, question), out) for i in range(n)]


def throughput(results) -> float:
    return sum(r.completion_tokens for r in results) / max(r.end_s for r in results)


def run_one(eng: Engine, rid: str, prompt, max_new: int = 4):
    eng.add_request(rid, prompt, max_new)
    first = None
    while eng.has_work():
        for ev in eng.step().events:
            if ev.rid == rid and first is None:
                first = ev
    return first


# --- GPU radix cache --------------------------------------------------------------------------


def test_shared_prefix_is_cached_and_skips_prefill():
    eng = Engine(EngineParams(max_total_tokens=50_000, max_running_requests=8), KIMI, BPT)
    system = ids(1, 3000)
    a = run_one(eng, "a", system + ids(2, 100))
    clock = eng.clock_s
    eng.add_request("b", system + ids(3, 100), 4)
    step = eng.step()
    assert a.cached_tokens == 0
    assert 3000 - block_size(1) < step.events[0].cached_tokens <= 3000
    assert "#cached-token: 29" in step.log_lines[0] or "#cached-token: 30" in step.log_lines[0]
    cold = KIMI.prefill_s(3100)
    assert eng.clock_s - clock < cold / 5  # the hit skipped the prefix's prefill
    while eng.has_work():
        eng.step()
    st = eng.stats()
    assert st.cached_tokens_total == step.events[0].cached_tokens
    assert 0.4 < st.cache_hit_rate < 0.6


def test_disable_radix_cache_means_no_reuse():
    params = EngineParams(max_total_tokens=50_000, max_running_requests=8, radix_cache=False)
    eng = Engine(params, KIMI, BPT)
    system = ids(1, 3000)
    run_one(eng, "a", system)
    assert run_one(eng, "b", system + ids(3, 10)).cached_tokens == 0
    assert eng.stats().cached_tokens_total == 0


def test_cached_tokens_are_page_aligned():
    params = EngineParams(max_total_tokens=50_000, max_running_requests=8, page_size=64)
    eng = Engine(params, KIMI, BPT)
    system = ids(1, 1000)
    run_one(eng, "a", system)
    cached = run_one(eng, "b", system + ids(2, 50)).cached_tokens
    assert cached == 960  # 15 pages of 64; the 16th page is not full


def test_identical_prompt_recomputes_at_least_one_token():
    eng = Engine(EngineParams(max_total_tokens=50_000, max_running_requests=8), KIMI, BPT)
    prompt = ids(5, 1024)
    run_one(eng, "a", prompt)
    cached = run_one(eng, "b", prompt).cached_tokens
    assert cached == 1024 - 16  # the last full block holds the token that must be computed


def test_lru_evicts_the_oldest_unlocked_leaf_first():
    cache = RadixCache(block=16)
    old, new = chain_keys(ids(1, 64), 16), chain_keys(ids(2, 64), 16)
    p_old: list = []
    p_new: list = []
    cache.insert(old, p_old, now=1)
    cache.insert(new, p_new, now=2)
    cache.unlock(p_old, now=3)
    cache.unlock(p_new, now=4)
    assert cache.evictable == cache.gpu_tokens == 128
    assert cache.evict(32, now=5) == 32
    gpu_old, _ = cache.match(old, 4)
    gpu_new, _ = cache.match(new, 4)
    assert (len(gpu_old), len(gpu_new)) == (2, 4)  # leaves first, oldest first
    cache.lock(gpu_new)
    assert cache.evict(1000, now=6) == 32  # locked nodes stay
    assert cache.gpu_tokens == 64


# --- HiCache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_hicache_raises_cached_tokens_and_throughput_when_prefixes_outgrow_the_pool(policy):
    # 12 system prompts x 4k = 48k tokens of prefixes cycling through a 30k-token GPU pool,
    # three requests in a row per prompt: the 2nd and 3rd hit on the GPU, but LRU evicts the
    # prefix before its next turn; the host tier keeps it (write_through_selective: once the
    # GPU hits made it hot).
    reqs = shared_prefix_workload(groups=12, prefix=4000, question=100, out=16, n=144, burst=3)
    base = EngineParams(max_total_tokens=30_000, max_running_requests=64)
    hi = replace(base, hicache_host_tokens=200_000, hicache_write_policy=policy)
    plain = run_closed_loop(base, KIMI, BPT, reqs, 1)
    tiered = run_closed_loop(hi, KIMI, BPT, reqs, 1)
    cached_plain = sum(r.cached_tokens for r in plain)
    cached_tiered = sum(r.cached_tokens for r in tiered)
    assert cached_plain > 0
    assert cached_tiered > 1.3 * cached_plain
    assert throughput(tiered) > 1.1 * throughput(plain)
    ttft = [statistics.mean(r.first_token_s - r.start_s for r in res) for res in (plain, tiered)]
    assert ttft[1] < ttft[0] * 0.8
    eng = Engine(hi, KIMI, BPT)
    for i, r in enumerate(reqs[:60]):
        run_one(eng, str(i), r.input_ids, r.max_new_tokens)
    st = eng.stats()
    assert st.load_back_tokens_total > 0 and st.evicted_tokens_total > 0
    assert 0 < st.host_used_tokens <= 200_000


def test_hicache_does_not_change_running_capacity_on_unique_prompts():
    rng = random.Random(7)
    reqs = [
        SimRequest(ids(100 + i, rng.randint(1000, 2500)), rng.randint(300, 900)) for i in range(150)
    ]
    base = EngineParams(max_total_tokens=60_000, max_running_requests=512, decode_log_interval=1)
    hi = replace(base, hicache_host_tokens=240_000)

    def run(params):
        eng = Engine(params, KIMI, BPT)
        nxt = 100
        for i in range(nxt):
            eng.add_request(str(i), reqs[i].input_ids, reqs[i].max_new_tokens)
        running, gen = [], 0
        while eng.has_work():
            step = eng.step()
            for line in step.log_lines:
                if line.startswith("Decode"):
                    running.append(int(line.split("#running-req: ")[1].split(",")[0]))
            for ev in step.events:
                if ev.finished:
                    gen += ev.completion_tokens
                    if nxt < len(reqs):
                        eng.add_request(str(nxt), reqs[nxt].input_ids, reqs[nxt].max_new_tokens)
                        nxt += 1
        return eng.stats(), max(running), statistics.median(running), gen / eng.clock_s

    st0, max0, med0, thr0 = run(base)
    st1, max1, med1, thr1 = run(hi)
    assert st1.max_total_num_tokens == st0.max_total_num_tokens
    assert (max1, med1) == (max0, med0)  # admission counts GPU slots only
    assert st1.cached_tokens_total == st0.cached_tokens_total == 0
    # Host writes cost a little; retracted requests may reload their prompt instead of
    # recomputing it (they count no cached tokens): either way only a small change.
    assert abs(thr1 - thr0) < 0.05 * thr0


# --- invariants under churn -------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        EngineParams(
            max_total_tokens=12_000, max_running_requests=32, schedule_conservativeness=0.3
        ),
        EngineParams(
            max_total_tokens=12_000,
            max_running_requests=32,
            page_size=16,
            chunked_prefill_size=1024,
            hicache_host_tokens=40_000,
            schedule_conservativeness=0.3,
        ),
        EngineParams(
            max_total_tokens=12_000,
            max_running_requests=32,
            page_size=64,
            hicache_host_tokens=30_000,
            hicache_write_policy="write_back",
            schedule_policy="lpm",
        ),
        EngineParams(max_total_tokens=12_000, max_running_requests=32, radix_cache=False),
    ],
    ids=["radix", "hicache-page16-chunked", "write-back-lpm", "no-radix"],
)
def test_kv_accounting_stays_consistent_under_churn(params):
    rng = random.Random(3)
    prefixes = [ids(50 + g, 1500) for g in range(6)]
    eng = Engine(params, KIMI, BPT, seed=2)
    live: list[str] = []
    total = params.max_total_tokens
    for n in range(400):
        if rng.random() < 0.6:
            prompt = prefixes[rng.randrange(6)] + ids(n, rng.randint(1, 600))
            stop = rng.choice([None, rng.randint(1, 50)])
            eng.add_request(f"r{n}", prompt, rng.randint(1, 400), stop_after=stop)
            live.append(f"r{n}")
        if live and rng.random() < 0.05:
            eng.abort(live.pop(rng.randrange(len(live))))
        step = eng.step()
        for ev in step.events:
            if ev.finished and ev.rid in live:
                live.remove(ev.rid)
        st = eng.stats()
        assert 0 <= st.num_used_tokens <= total
        assert eng.pool.free() >= 0
        cache = eng.pool.cache
        if cache is not None:
            assert 0 <= cache.evictable <= cache.gpu_tokens <= total
            assert 0 <= cache.host_used <= cache.host_capacity
    while eng.has_work():
        eng.step()
    st = eng.stats()
    assert st.num_used_tokens == 0 and st.num_running_reqs == 0 and st.num_queue_reqs == 0
    assert eng.pool.private == 0
    if eng.pool.cache is not None:
        assert eng.pool.cache.evictable == eng.pool.cache.gpu_tokens


def test_multi_turn_follow_up_reuses_the_rendered_answer():
    from tuner.sim import tokens

    eng = Engine(EngineParams(max_total_tokens=50_000, max_running_requests=8), KIMI, BPT)
    turn1 = list(ids(1, 500))
    eng.add_request("t1", turn1, 200, output_seed=4242)
    while eng.has_work():
        eng.step()
    answer = tokens.encode(tokens.render([tokens.output_token_id(4242, i) for i in range(200)]))
    follow_up = turn1 + answer + list(ids(2, 50))
    cached = run_one(eng, "t2", follow_up).cached_tokens
    assert cached >= 500 + 199 - 16  # prompt and answer (the last token has no KV yet)
    eng.add_request("t3", turn1 + answer + list(ids(3, 50)), 4)  # no seed needed to match
    assert eng.step().events[0].cached_tokens >= 500 + 199 - 16
    plain = Engine(EngineParams(max_total_tokens=50_000, max_running_requests=8), KIMI, BPT)
    run_one(plain, "t1", turn1, 200)
    assert run_one(plain, "t2", follow_up).cached_tokens < 500 + 16  # answer not matched
