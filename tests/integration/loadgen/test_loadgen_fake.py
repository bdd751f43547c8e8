"""The load client against a tiny SGLang-speaking aiohttp server (real HTTP on 127.0.0.1:
tests/helpers/fake_http.py)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from dataclasses import replace
from typing import Any

import pytest

from tests.helpers.fake_http import FakeConfig, FakeSGLang, ServerThread
from tuner.config.workload import WorkloadSection
from tuner.errors import ConfigError, HostUnreachable, TrialTimeout
from tuner.loadgen.bounds import Bounds
from tuner.loadgen.metrics import summarize
from tuner.loadgen.options import LoadOptions, load_options
from tuner.loadgen.run import make_session, run_load, run_load_sync
from tuner.loadgen.workload import WARMUP_MAX_TOKENS, Request, requests_for


def _reqs(n: int = 20, out: int = 8, inp: int = 16, **kw) -> list[Request]:
    # lengths uniform in [1, L] unless the test says otherwise (bench_serving's random rule)
    w = WorkloadSection(input_len=inp, output_len=out, **{"range_ratio": 0.0, **kw})
    return requests_for(w, num_requests=n)


def _opts(
    concurrency: int = 4,
    api_key: str | None = None,
    metrics_interval_s: float = 0.05,
    flush_pause_s: float = 1.0,
    **workload: Any,
) -> LoadOptions:
    """Options from a workload section (`workload`: its keys) plus the client's own knobs."""
    # no flush unless asked; a generous duration only so that a hang fails instead of blocking
    base = {"duration_s": 120, "flush_cache": False, "max_error_rate": 0.1}
    opts = load_options(
        WorkloadSection(**{**base, **workload}), concurrency=concurrency, api_key=api_key
    )
    return replace(opts, metrics_interval_s=metrics_interval_s, flush_pause_s=flush_pause_s)


@pytest.mark.parametrize("backend", ["sglang", "openai", "openai-chat"])
@pytest.mark.parametrize("coalesce", [1, 3])
def test_token_counts_match_server(backend: str, coalesce: int) -> None:
    fake = FakeSGLang(FakeConfig(coalesce=coalesce, token_delay_s=0.001))
    reqs = _reqs(24, out=10)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, reqs, _opts(backend=backend))
    m = res.metrics()
    assert res.stopped == "done" and m.completed == 24 and m.errors == 0
    assert m.total_output == sum(r.output_len for r in reqs)
    # the server's counters saw exactly what the client counted (warm-up excluded)
    assert res.server is not None and res.server.generation_tokens == m.total_output
    assert res.server.requests == 24
    assert all(r.ttft_s is not None and r.ttft_s <= r.latency_s for r in res.records)
    if backend == "sglang":
        # native streams are cumulative: one ITL entry per token after the first read. A busy
        # machine may deliver several events in that read, so its token count varies, but it
        # ends on one of the server's event boundaries
        for rec in res.records:
            n = rec.output_len
            boundaries = {min(i, n) for i in range(coalesce, n + coalesce, coalesce)}
            assert n - len(rec.itl_s) in boundaries, (n, len(rec.itl_s), coalesce)
            # a read's gap is shared by its tokens: the shares add up to the time between reads
            assert rec.ttft_s + sum(rec.itl_s) <= rec.latency_s + 1e-6
        assert res.server.cache_hit_rate == pytest.approx(0.5, abs=0.05)
    assert fake.seen_auth == [None] * len(fake.seen_auth)


def test_non_streaming_counts() -> None:
    fake = FakeSGLang()
    reqs = _reqs(6, out=5)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, reqs, _opts(stream=False, warmup_requests=0))
    assert res.metrics().total_output == sum(r.output_len for r in reqs)


def test_closed_loop_respects_concurrency() -> None:
    fake = FakeSGLang(FakeConfig(token_delay_s=0.01))
    peak = 0

    async def go() -> None:
        nonlocal peak
        async with make_session(_opts()) as session:
            task = asyncio.create_task(
                run_load(session, srv.url, _reqs(16, out=10, range_ratio=1.0), _opts(concurrency=3))
            )
            while not task.done():
                peak = max(peak, fake.running)
                await asyncio.sleep(0.002)
            res = task.result()
            assert res.metrics().completed == 16

    with ServerThread(fake) as srv:
        asyncio.run(go())
    assert peak == 3


def test_duration_bound_cancels_and_counts_in_flight() -> None:
    # A request lasts ~0.1 s (20 tokens x 5 ms) against a 1 s bound, so some
    # complete even on a loaded machine, and 200 of them (~5 s) cannot all fit.
    fake = FakeSGLang(FakeConfig(token_delay_s=0.005))
    # 10-20 tokens each: equal lengths kept the four streams in lock-step, so a cut that fell
    # between one's last token and its stream's end (a busy machine) fell there for all four
    reqs = _reqs(200, out=20, range_ratio=0.5)
    asked = {r.index: r.output_len for r in reqs}
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, reqs, _opts(duration_s=1.0, concurrency=4))
    m = res.metrics()
    assert res.stopped == "duration"
    # cut at the window's end; the slack is the event loop's lateness on a busy machine
    assert 0.95 < res.duration_s < 5.0
    assert m.cancelled == 4 and m.errors == 0
    assert 0 < m.completed < 200
    cut = [r for r in res.records if r.cancelled]
    # a cut request keeps what it got: all its tokens when the cut fell between its last token
    # and the end of its stream (a busy machine can make that moment the cut's) ...
    assert all(0 <= r.output_len <= asked[r.index] for r in cut)
    # ... but four requests of different lengths all at that moment do not: they are partial
    assert m.cut_output < sum(asked[r.index] for r in cut), [r.output_len for r in cut]
    # only completed requests count; the cut ones' tokens are reported apart
    done = [r for r in res.records if r.ok]
    assert m.total_output == sum(asked[r.index] for r in done) == sum(r.output_len for r in done)
    assert m.cut_output == sum(r.output_len for r in cut)
    assert m.window_output_throughput >= m.output_throughput


def test_errors_counted_then_budget_stops_run() -> None:
    fake = FakeSGLang(FakeConfig(fail_every=5))
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, _reqs(60, out=3), _opts(warmup_requests=0, max_error_rate=0.3))
        m = res.metrics()
        assert res.stopped == "done" and m.errors == 12 and m.completed == 48
        assert m.error_kinds == {"http 500": 12}
        assert m.error_rate == pytest.approx(0.2)
        res = run_load_sync(
            srv.url, _reqs(60, out=3), _opts(warmup_requests=0, max_error_rate=0.05)
        )
    assert res.stopped == "error_budget" and res.flagged
    assert len(res.records) < 60


def test_fast_failures_at_high_concurrency_stay_inside_the_budget() -> None:
    # 1 in 8 requests fails at once while the others stream for ~0.3 s: at concurrency 64 the
    # first 8 requests to end are all failures, yet 12.5% is well inside a 30% budget
    fake = FakeSGLang(FakeConfig(fail_every=8, token_delay_s=0.01))
    with ServerThread(fake) as srv:
        res = run_load_sync(
            srv.url,
            _reqs(128, out=30, range_ratio=1.0),
            _opts(concurrency=64, warmup_requests=0, max_error_rate=0.3),
        )
    m = res.metrics()
    # not stopped by the error budget; the client's self-check may still flag the run on a
    # busy machine (event-loop lag), so `flagged` is asserted to come from nothing else
    assert res.stopped == "done" and res.flagged == (not res.self_check.ok)
    assert m.errors == 16 and m.completed == 112


def test_timeouts_are_records_not_crashes() -> None:
    fake = FakeSGLang(FakeConfig(hang_every=4))
    with ServerThread(fake) as srv:
        res = run_load_sync(
            srv.url,
            _reqs(8, out=3),
            # the hung ones time out; the others (a few ms each) must end well within it, even
            # on a busy machine (2 s stays under the 5 s stall bound: not "unresponsive")
            _opts(warmup_requests=0, request_timeout_s=2.0, max_error_rate=1),
        )
    m = res.metrics()
    assert m.errors == 2 and m.completed == 6 and m.error_kinds == {"timeout": 2}


def test_api_key_sent_and_never_in_repr() -> None:
    fake = FakeSGLang(FakeConfig(api_key="s3cret"))
    opts = _opts(api_key="s3cret")
    assert "s3cret" not in repr(opts)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, _reqs(4, out=2), opts)
        assert res.metrics().completed == 4
        assert set(fake.seen_auth) == {"Bearer s3cret"}
        with pytest.raises(ConfigError, match="API key"):
            run_load_sync(srv.url, _reqs(4, out=2), _opts(api_key="wrong"))


def test_unreachable_url_raises_infra_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(HostUnreachable, match="cannot reach"):
        run_load_sync(f"http://127.0.0.1:{port}", _reqs(2), _opts())


def test_multi_turn_sends_turns_in_order() -> None:
    fake = FakeSGLang(FakeConfig(token_delay_s=0.002))
    spec = WorkloadSection(
        kind="multi-turn",
        turns=4,
        input_len=8,
        output_len=6,
        question_len=3,
        range_ratio=0.0,
        seed=3,
    )
    reqs = requests_for(spec, num_requests=24)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, reqs, _opts(concurrency=8, warmup_requests=0))
    assert res.metrics().completed == 24
    by_index = {r.index: r for r in reqs}
    for conv in {r.conversation for r in reqs}:
        recs = sorted((r for r in res.records if r.conversation == conv), key=lambda r: r.turn)
        assert [r.turn for r in recs] == [0, 1, 2, 3]
        for a, b in itertools.pairwise(recs):
            # turn k+1 starts only after turn k ended
            assert b.start_s >= a.start_s + a.latency_s - 1e-3
            assert by_index[b.index].prompt_len > by_index[a.index].prompt_len


def test_poisson_rate_is_roughly_honoured() -> None:
    fake = FakeSGLang()
    with ServerThread(fake) as srv:
        res = run_load_sync(
            srv.url, _reqs(40, out=2), _opts(request_rate=100.0, concurrency=64, warmup_requests=0)
        )
    starts = sorted(r.start_s for r in res.records)
    span = starts[-1] - starts[0]
    # 39 seeded gaps of mean 10 ms (0.47 s here; sleeps never end early); the upper bound is
    # generous for a loaded 2-core machine and still catches a rate ten times too low
    assert 0.15 < span < 3.0
    assert summarize(res.records, res.duration_s).completed == 40


def test_flush_cache_is_called() -> None:
    fake = FakeSGLang()
    with ServerThread(fake) as srv:
        run_load_sync(srv.url, _reqs(2), _opts(flush_cache=True, flush_pause_s=0.0))
    assert fake.flushes == 1


def test_a_server_that_stops_answering_ends_the_run_unresponsive_within_the_stall() -> None:
    # 20 s window: the stall bound (5 s) ends the run long before the window would
    fake = FakeSGLang(FakeConfig(token_delay_s=0.01, freeze_after=12))
    opts = _opts(duration_s=20, concurrency=4, warmup_requests=1, flush_cache=True)
    bounds = Bounds.of(opts)
    with ServerThread(fake) as srv:
        t0 = time.monotonic()
        res = run_load_sync(srv.url, _reqs(200, out=40, range_ratio=1.0), opts)
        took = time.monotonic() - t0
    print(
        f"\nfrozen server: run took {took:.1f} s; stall {bounds.stall_s} s, bound {bounds.total_s} s"
    )
    assert res.stopped == "unresponsive" and res.unresponsive
    assert res.silent_s >= bounds.stall_s
    assert took < bounds.total_s and took < opts.duration_s  # the window was not waited out
    m = res.metrics()
    assert m.completed >= 1 and m.cancelled >= 1  # what it measured before the freeze is kept
    assert res.summary()["stopped"] == "unresponsive"


def test_a_window_that_ends_in_silence_is_marked_unresponsive() -> None:
    # the third request freezes the server (~0.2 s in): silent for most of the 2 s window,
    # far beyond the 0.5 s quiet bound even when a busy machine makes the first ones slow
    fake = FakeSGLang(FakeConfig(token_delay_s=0.01, freeze_after=2))
    opts = _opts(duration_s=2.0, concurrency=2, warmup_requests=0)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, _reqs(100, out=20, range_ratio=1.0), opts)
    assert res.stopped == "unresponsive" and res.silent_s >= Bounds.of(opts).quiet_s
    assert res.metrics().completed >= 1  # it answered before it went silent


def test_ordinary_errors_and_a_slow_stream_are_not_unresponsive() -> None:
    # a token every 50 ms, each request 1.5 s: slow, never silent for the window's 1 s quiet
    # bound. The server runs in this process, so a stall of the whole process looks like a
    # silent server: the window is long enough for a quiet bound well above the stalls of a
    # busy machine (a 1.5 s window's 0.375 s was not)
    fake = FakeSGLang(FakeConfig(fail_every=3, token_delay_s=0.05))
    opts = _opts(duration_s=4.0, concurrency=2, warmup_requests=0, max_error_rate=1)
    assert Bounds.of(opts).quiet_s == 1.0
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, _reqs(100, out=30, range_ratio=1.0), opts)
    assert res.stopped == "duration" and res.metrics().errors > 0


def test_a_warm_up_answered_by_nothing_ends_the_run_at_once() -> None:
    fake = FakeSGLang(FakeConfig())
    fake.frozen = True
    opts = _opts(duration_s=30, request_timeout_s=1.5, warmup_requests=2, flush_cache=True)
    phases: list[str] = []
    with ServerThread(fake) as srv:
        t0 = time.monotonic()
        res = run_load_sync(srv.url, _reqs(20), opts, on_phase=phases.append)
        took = time.monotonic() - t0
    print(f"\nsilent warm-up: run took {took:.1f} s (warm-up bound {Bounds.of(opts).warmup_s} s)")
    assert res.stopped == "unresponsive" and res.records == () and res.silent_s >= 1.0
    assert took < 10 and phases == ["warmup"]  # no flush, no timed run against a hung server


def test_the_callers_time_limit_cuts_the_whole_run() -> None:
    fake = FakeSGLang(FakeConfig(token_delay_s=0.01))
    phases: list[str] = []
    with ServerThread(fake) as srv:
        t0 = time.monotonic()
        with pytest.raises(TrialTimeout, match="time left"):
            run_load_sync(
                srv.url,
                _reqs(500, out=40),
                _opts(duration_s=30),
                # time for the warm-up (one request of ~0.3 s) on a busy machine, then the load
                # run is cut: whole, its ~10,000 tokens at 10 ms and concurrency 4 take ~25 s
                time_limit_s=3.0,
                on_phase=phases.append,
            )
        took = time.monotonic() - t0
    assert took < 10 and phases == ["warmup", "load"]


def test_warm_up_answers_are_cut_to_32_tokens_as_bench_servings_are() -> None:
    """Three warm-up requests of 100-token answers ask for 32 tokens each (WARMUP_MAX_TOKENS);
    the timed run's four ask for all 100."""
    fake = FakeSGLang()
    reqs = _reqs(4, out=100, range_ratio=1.0)
    assert {r.output_len for r in reqs} == {100}
    opts = _opts(warmup_requests=3, num_requests=4, duration_s=None)
    with ServerThread(fake) as srv:
        res = run_load_sync(srv.url, reqs, opts)
    assert len(res.records) == 4 and all(r.output_len == 100 for r in res.records)
    assert fake.gen_tokens == 3 * WARMUP_MAX_TOKENS + 4 * 100 and WARMUP_MAX_TOKENS == 32
