"""Benchmark of the pure engine: throughput curve per profile and virtual-time speedup.

Run: `pytest -m bench tests/bench/bench_engine.py -s` or `python tests/bench/bench_engine.py`.
Each profile runs its default launch flags (Kimi at --mem-fraction-static 0.85) under a closed
loop of 2-4k-token requests (input 1,000-2,500, output 500-1,500 tokens, ignore_eos).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import pytest

from tuner.sim.engine import Engine, EngineParams, SimRequest, StepTimeModel, run_closed_loop
from tuner.sim.profile import load_profile

pytestmark = pytest.mark.bench

PROFILES = {
    "kimi-k2.5-tp8": ["--tp-size", "8", "--mem-fraction-static", "0.85"],
    "llama-3.1-8b-h100": [],
    "qwen2.5-7b-l4": [],
}
CONCURRENCY = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Point:
    """One closed-loop run."""

    concurrency: int
    output_tok_s: float
    log_gen_tok_s: float  # median of the decode log's gen throughput
    running: float  # median #running-req in the decode log
    retracted: int
    sim_s: float
    wall_s: float

    @property
    def speedup(self) -> float:
        return self.sim_s / self.wall_s


def profile_engine_inputs(name: str) -> tuple[EngineParams, StepTimeModel, int]:
    """EngineParams the simulated server would use with the profile's default flags."""
    from tuner.sim.bootstrap import engine_params  # SIM-SERVER's flags -> params
    from tuner.sim.flags import parse_flags
    from tuner.sim.startup import build_script

    profile = load_profile(name)
    ns = parse_flags(["--model-path", "m", "--sim-profile", name, *PROFILES[name]])
    script = build_script(ns, profile)
    assert script.plan is not None
    timing = StepTimeModel.from_mapping(profile.timing)
    return engine_params(ns, script), timing, script.plan.bytes_per_token


def workload(n: int, seed: int = 1) -> list[SimRequest]:
    """Unique random prompts of 1,000-2,500 tokens, 500-1,500 output tokens."""
    rng = random.Random(seed)
    return [
        SimRequest(
            tuple(rng.randrange(1000, 101000) for _ in range(rng.randint(1000, 2500))),
            rng.randint(500, 1500),
        )
        for _ in range(n)
    ]


def run_point(params, timing, bpt, reqs: list[SimRequest], concurrency: int) -> Point:
    """Closed loop through Engine.step() (the HTTP path's API) with the decode log parsed."""
    eng = Engine(params, timing, bpt, seed=0)
    nxt = min(concurrency, len(reqs))
    for i in range(nxt):
        eng.add_request(str(i), reqs[i].input_ids, reqs[i].max_new_tokens)
    gen, running, thr = 0, [], []
    t0 = time.perf_counter()
    while eng.has_work():
        step = eng.step()
        for line in step.log_lines:
            if line.startswith("Decode batch"):
                running.append(int(line.split("#running-req: ")[1].split(",")[0]))
                thr.append(float(line.split("(token/s): ")[1].split(",")[0]))
        for ev in step.events:
            if ev.finished:
                gen += ev.completion_tokens
                if nxt < len(reqs):
                    eng.add_request(str(nxt), reqs[nxt].input_ids, reqs[nxt].max_new_tokens)
                    nxt += 1
    wall = time.perf_counter() - t0
    mid = slice(len(thr) // 5, max(len(thr) * 4 // 5, 1))
    st = eng.stats()
    return Point(
        concurrency,
        gen / eng.clock_s,
        statistics.median(thr[mid]) if thr else 0.0,
        statistics.median(running[mid]) if running else 0.0,
        st.retracted_reqs_total,
        eng.clock_s,
        wall,
    )


def curve(name: str, n_requests: int = 768) -> list[Point]:
    params, timing, bpt = profile_engine_inputs(name)
    reqs = workload(n_requests)
    return [run_point(params, timing, bpt, reqs, c) for c in CONCURRENCY]


def closed_loop_speedup(name: str, concurrency: int, n_requests: int = 768) -> float:
    """Simulated seconds per wall second of run_closed_loop (no per-step event objects)."""
    params, timing, bpt = profile_engine_inputs(name)
    reqs = workload(n_requests)
    t0 = time.perf_counter()
    res = run_closed_loop(params, timing, bpt, reqs, concurrency)
    return max(r.end_s for r in res) / (time.perf_counter() - t0)


def main() -> None:
    for name in PROFILES:
        print(f"\n{name}")
        print(" conc  out tok/s  log tok/s  running  retracted   sim s   wall s  step() x  loop x")
        for p in curve(name):
            loop = closed_loop_speedup(name, p.concurrency) if p.concurrency in (64, 256) else 0
            print(
                f"{p.concurrency:5d} {p.output_tok_s:10.0f} {p.log_gen_tok_s:10.0f} "
                f"{p.running:8.0f} {p.retracted:10d} {p.sim_s:7.0f} {p.wall_s:8.2f} "
                f"{p.speedup:8.0f}x {loop:6.0f}x"
            )


@pytest.mark.parametrize("name", list(PROFILES))
def test_bench_engine(name: str) -> None:
    """Throughput rises to a knee then stays flat; the engine runs far faster than real time."""
    points = curve(name)
    for p in points:
        print(f"{name} c={p.concurrency} {p.output_tok_s:.0f} tok/s x{p.speedup:.0f}")
    best = max(p.output_tok_s for p in points)
    assert points[0].output_tok_s < best * 0.8
    assert points[-1].output_tok_s > best * 0.85
    assert all(p.speedup > 100 for p in points if p.concurrency in (64, 256))


if __name__ == "__main__":
    main()
