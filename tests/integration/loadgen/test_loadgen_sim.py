"""The load client against the real simulator subprocess (`tuner sim`, real HTTP on 127.0.0.1).

The server's own counters are the referee: what the client counts must be what the server
says it generated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tests.helpers.simproc import SimProc, sim_server
from tuner.config.workload import WorkloadSection
from tuner.loadgen.options import LoadOptions, load_options
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import Request, requests_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProc]:
    with sim_server(
        "--sim-profile", "llama-3.1-8b-h100", "--enable-metrics", "--sim-seed", "1"
    ) as s:
        yield s


def _opts(concurrency: int = 16, flush_pause_s: float = 1.0, **workload: Any) -> LoadOptions:
    """Options from a workload section (`workload`: its keys) plus the client's own knobs."""
    # no flush unless asked; a generous duration only so that a hang fails instead of blocking
    base = {"duration_s": 120, "flush_cache": False, "max_error_rate": 0.1}
    w = WorkloadSection(**{**base, **workload})
    opts = load_options(w, concurrency=concurrency)
    return replace(opts, metrics_interval_s=0.2, flush_pause_s=flush_pause_s)


def _reqs(n: int, **workload: Any) -> list[Request]:
    # lengths uniform in [1, L] unless the test says otherwise (bench_serving's random rule)
    return requests_for(WorkloadSection(**{"range_ratio": 0.0, **workload}), num_requests=n)


@pytest.mark.parametrize("backend", ["sglang", "openai", "openai-chat"])
def test_client_tokens_equal_server_generation_delta(sim: SimProc, backend: str) -> None:
    reqs = _reqs(48, input_len=200, output_len=48, seed=2)
    res = run_load_sync(sim.url, reqs, _opts(backend=backend))
    m = res.metrics()
    assert res.stopped == "done" and m.completed == 48 and m.errors == 0
    assert m.total_output == sum(r.output_len for r in reqs)  # ignore_eos: exact lengths
    assert res.server is not None
    assert res.server.generation_tokens == m.total_output
    assert res.server.requests == 48
    # the throughput the client reports is the server's delta over the run, within 2%
    server_rate = res.server.generation_tokens / res.duration_s
    assert m.output_throughput == pytest.approx(server_rate, rel=0.02)
    assert res.server.samples >= 1 and res.server.mean_running_reqs is not None
    # the client measured itself (its verdict depends on the machine's load, so not asserted)
    sc = res.self_check
    assert sc.loop_lag_max_ms > 0 and sc.cpu_fraction > 0, sc
    assert sc.ok == (not sc.reasons), sc
    assert m.ttft_ms.mean > 0 and m.itl_ms.n > 0 and m.concurrency > 1


def test_shared_prefix_hits_the_server_cache_random_does_not(sim: SimProc) -> None:
    shared = WorkloadSection(
        kind="shared-prefix",
        num_groups=4,
        prompts_per_group=8,
        prefix_len=400,
        question_len=20,
        output_len=8,
        seed=3,
    )
    reqs = requests_for(shared, num_requests=32)
    # 4 streams: a request waits for a slot, so its group's first prefill is done and cached
    # (at 16 the first wave of 16 may all miss together, 16 x 400 of 32 x 420 tokens = 0.476,
    # as it did on a busy machine)
    res = run_load_sync(sim.url, reqs, _opts(4, flush_cache=True, flush_pause_s=0.1))
    assert res.metrics().completed == 32
    hit_shared = res.server.cache_hit_rate
    rand = _reqs(32, input_len=420, output_len=8, range_ratio=1.0, seed=4)
    res = run_load_sync(sim.url, rand, _opts(flush_cache=True, flush_pause_s=0.1))
    hit_random = res.server.cache_hit_rate
    # at least 28 of 32 prompts find their 400-token prefix cached: >= 0.83 of prompt tokens
    assert hit_shared > 0.75 > 0.1 > hit_random, (hit_shared, hit_random)


def test_multi_turn_history_is_cached_by_the_server(sim: SimProc) -> None:
    spec = WorkloadSection(
        kind="multi-turn",
        turns=3,
        input_len=200,
        output_len=16,
        question_len=16,
        range_ratio=1.0,
        seed=5,
    )
    reqs = requests_for(spec, num_requests=24)
    res = run_load_sync(sim.url, reqs, _opts(flush_cache=True, flush_pause_s=0.1))
    m = res.metrics()
    assert m.completed == 24 and m.errors == 0
    # later turns resend earlier prompts: part of their prompt is a cache hit
    assert res.server.cache_hit_rate > 0.2


def test_duration_bounded_run_tracks_the_server(sim: SimProc) -> None:
    reqs = _reqs(2000, input_len=100, output_len=64, seed=6)
    res = run_load_sync(sim.url, reqs, _opts(duration_s=2.0, concurrency=32, warmup_requests=0))
    m = res.metrics()
    # cut at the window's end (2,000 requests take far longer); the slack is the client's
    # event-loop lateness on a busy machine
    assert res.stopped == "duration" and 1.9 < res.duration_s < 6.0
    assert m.completed > 0 and m.cancelled > 0 and m.errors == 0
    # the server counts a request when it ends: completed ones surely, the cut ones once it
    # noticed the disconnect (with the few tokens it made after the cut)
    gen = res.server.generation_tokens
    assert m.total_output <= gen <= m.total_output + m.cut_output + 16 * m.cancelled


def test_a_cut_rule_ends_the_run_and_what_it_heard_is_what_was_recorded(sim: SimProc) -> None:
    """search/cut.py's seam on real HTTP: the rule hears the run about once a second (tokens
    counted as streamed, requests streaming); its reason stops the run as cut within a tick,
    and the requests in flight are recorded as cut with what they had received."""
    heard = []

    def rule(p):
        heard.append(p)
        return "cannot beat it" if p.elapsed_s >= 2.0 else None

    reqs = _reqs(400, input_len=200, output_len=400, seed=3)
    res = run_load_sync(sim.url, reqs, _opts(concurrency=16, duration_s=60), cut=rule)
    assert res.stopped == "cut" and res.cut_reason == "cannot beat it"
    assert 2.0 <= res.duration_s < 4.0  # not the 60 s window
    assert heard[-1].streaming > 0 and heard[-1].window_s == 60
    assert len(heard[-1].first_waits) == heard[-1].done + 16  # 16 streams: every one started
    # tokens only add up after the tick (cut requests keep what they had received)
    assert heard[-1].output_tokens <= sum(r.output_len for r in res.records)
    assert sum(r.cancelled for r in res.records) >= 1
    assert res.summary()["cut_reason"] == "cannot beat it"
