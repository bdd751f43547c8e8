"""What the SSH tunnel costs the load client (not CI): `pytest -m bench tests/bench/bench_tunnel.py -s`.

The same short load runs (tuner.loadgen's `run_load_sync`, as a study runs them) against one
server directly, through the forward in a child process (`ForwardProcess`, what a study uses)
and through the same forward in threads of the client's own process (`Forward`), over the real
test sshd, interleaved in one run so every way sees the same (busy) machine:

1. the simulator (llama-3.1-8b-h100, the profile with the most tokens/s) at 64 and 256 streams:
   what a study measures, and whether the client's event loop lags more with the tunnel's
   pump thread in the same process;
2. the zero-cost fake SGLang (tests/bench/bench_loadgen.py's): the most the path carries.

Prints, per case and way, throughput and the client's loop lag p99, each also as a ratio to
the direct way.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable

import pytest

from tests.bench.bench_loadgen import fake_server
from tests.helpers.simproc import sim_server
from tests.helpers.sshd import Sshd
from tuner.config.workload import WorkloadSection
from tuner.hosts import SSHHost
from tuner.hosts.forward import Forward
from tuner.hosts.forward_proc import ForwardProcess
from tuner.loadgen.options import load_options
from tuner.loadgen.result import LoadResult
from tuner.loadgen.run import run_load_sync
from tuner.loadgen.workload import requests_for

pytestmark = [pytest.mark.bench, pytest.mark.ssh]

#: direct / tunnel runs per case, interleaved
ROUNDS = 3


def _run(
    url: str, concurrency: int, *, duration_s: float | None, n: int, out_len: int
) -> LoadResult:
    w = WorkloadSection(
        num_requests=n,
        duration_s=duration_s,
        input_len=128,
        output_len=out_len,
        range_ratio=1.0,
        warmup_requests=concurrency,
        flush_cache=False,
        max_error_rate=0.1,
        seed=1,
    )
    return run_load_sync(
        url, requests_for(w, num_requests=n), load_options(w, concurrency=concurrency)
    )


def _side_by_side(label: str, urls: dict[str, str], run: Callable[[str], LoadResult]) -> None:
    """Each way ROUNDS times, interleaved; medians, then each way's ratio to `direct`."""
    got: dict[str, list[LoadResult]] = {way: [] for way in urls}
    for _ in range(ROUNDS):
        for way, url in urls.items():
            res = run(url)
            assert res.metrics().errors == 0, res.summary()["error_kinds"]
            got[way].append(res)

    def med(way: str, fn: Callable[[LoadResult], float]) -> float:
        return statistics.median(fn(r) for r in got[way])

    tok = {w: med(w, lambda r: r.metrics().output_throughput) for w in got}
    lag = {w: med(w, lambda r: r.self_check.loop_lag_p99_ms) for w in got}
    for w in got:
        cpu = med(w, lambda r: r.self_check.cpu_fraction)
        print(
            f"{label:<24} {w:<18} {tok[w]:>7.0f} tok/s ({tok[w] / tok['direct']:.2f}x)  "
            f"loop lag p99 {lag[w]:>6.1f} ms ({lag[w] / max(lag['direct'], 0.1):.2f}x)  "
            f"client process cpu {cpu:.0%}"
        )


def _ways(host: SSHHost, direct: str, stack: contextlib.ExitStack) -> dict[str, str]:
    port = int(direct.rsplit(":", 1)[1])
    thread = stack.enter_context(Forward(host, port))
    proc = stack.enter_context(ForwardProcess(host.options, port))
    return {
        "direct": direct,
        "tunnel (process)": f"http://127.0.0.1:{proc.port}",  # what a study uses
        "tunnel (in-thread)": f"http://127.0.0.1:{thread.port}",
    }


def test_tunnel_against_direct(sshd_server: Sshd) -> None:
    host = SSHHost(sshd_server.options())
    print()
    try:
        sim_flags = ("--sim-profile", "llama-3.1-8b-h100", "--max-running-requests", "512")
        with (
            sim_server(*sim_flags, "--cuda-graph-max-bs", "512") as sim,
            contextlib.ExitStack() as st,
        ):
            urls = _ways(host, sim.url, st)
            for conc in (64, 256):
                _side_by_side(
                    f"simulator c={conc}",
                    urls,
                    lambda url, c=conc: _run(url, c, duration_s=None, n=c * 2, out_len=128),
                )
        with fake_server() as url, contextlib.ExitStack() as st:
            _side_by_side(
                "zero-cost server c=256",
                _ways(host, url, st),
                lambda u: _run(u, 256, duration_s=None, n=256 * 4, out_len=256),
            )
    finally:
        host.close()
