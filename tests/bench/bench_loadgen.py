"""The load client's own ceiling on this machine (not CI): `pytest -m bench tests/bench/bench_loadgen.py -s`.

1. Against a zero-cost endpoint (the fake SGLang in a subprocess, streaming pre-encoded events
   with no delay): streamed tokens/s (one token per SSE event) and requests/s one client process
   sustains at 64/256/512 concurrent streams.
2. Against the simulator (heaviest demand: llama-3.1-8b-h100, the fastest tokens/s profile) at
   the same concurrencies: what the server produces, and whether the client kept up (self-check).
Prints the ratio ceiling / simulator demand at 256 streams (goal >= 3x).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.paths import REPO
from tests.helpers.simproc import sim_server
from tuner.config.workload import WorkloadSection
from tuner.loadgen.options import load_options
from tuner.loadgen.result import LoadResult
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import requests_for

pytestmark = pytest.mark.bench

CONCURRENCIES = (64, 256, 512)


@contextlib.contextmanager
def fake_server() -> Iterator[str]:
    """The fake SGLang as a subprocess (its own core), ended by its process group."""
    proc = subprocess.Popen(
        # a zero-cost streaming server that prints its port
        [sys.executable, "-m", "tests.helpers.fake_http"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()  # an unclosed pipe is a ResourceWarning, and warnings are errors


def _run(url: str, concurrency: int, n: int, out_len: int, backend: str = "sglang") -> LoadResult:
    # closed loop over all n requests, no flush: the client's own ceiling
    w = WorkloadSection(
        backend=backend,
        num_requests=n,
        duration_s=None,
        input_len=64,
        output_len=out_len,
        range_ratio=1.0,
        warmup_requests=concurrency,
        flush_cache=False,
        max_error_rate=0.1,
        seed=1,
    )
    opts = load_options(w, concurrency=concurrency)
    return run_load_sync(url, requests_for(w, num_requests=n), opts)


def _line(label: str, res: LoadResult) -> str:
    m = res.metrics()
    c = res.self_check
    return (
        f"{label:<28} {m.output_throughput:>10.0f} tok/s {m.request_throughput:>8.1f} req/s "
        f"cpu {c.cpu_fraction:>4.0%} lag p99 {c.loop_lag_p99_ms:>6.1f} ms "
        f"{'ok' if c.ok else 'FLAGGED: ' + '; '.join(c.reasons)}"
    )


def test_client_ceiling_and_simulator_headroom() -> None:
    ceiling: dict[int, float] = {}
    print()
    with fake_server() as url:
        for conc in CONCURRENCIES:
            res = _run(url, conc, n=conc * 8, out_len=256)
            assert res.metrics().errors == 0
            ceiling[conc] = res.metrics().output_throughput
            print(_line(f"zero-cost native c={conc}", res))
        res = _run(url, 256, n=256 * 8, out_len=256, backend="openai")
        print(_line("zero-cost openai c=256", res))
        res = _run(url, 256, n=256 * 40, out_len=4)
        print(_line("zero-cost short reqs c=256", res))
    demand: dict[int, float] = {}
    with sim_server(
        "--sim-profile",
        "llama-3.1-8b-h100",
        "--enable-metrics",
        "--cuda-graph-max-bs",
        "512",
        "--max-running-requests",
        "512",
    ) as sim:
        for conc in CONCURRENCIES:
            res = _run(sim.url, conc, n=conc * 3, out_len=256)
            demand[conc] = (
                res.server.output_throughput if res.server else res.metrics().output_throughput
            )
            print(_line(f"simulator c={conc}", res) + f"  server says {demand[conc]:.0f} tok/s")
    ratio = ceiling[256] / demand[256]
    print(
        f"headroom at 256 streams: client ceiling {ceiling[256]:.0f} tok/s / simulator "
        f"{demand[256]:.0f} tok/s = {ratio:.1f}x (goal >= 3x)"
    )
    assert ratio > 1.0
