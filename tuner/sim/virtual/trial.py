"""One trial in virtual time: the simulator's start-up verdict and engine, no HTTP, no waiting.

Scores a configuration the way a study trial does (window output throughput, p99 TTFT with cut
requests counted by their wait, start-up and runtime failures as infeasible), from the same flag
parsing, start-up plan and engine parameters the HTTP simulator uses. Brute-force ground truth
for tests and benchmarks: a whole grid in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.loadgen.metrics import percentile
from tuner.server.launch import flag_args
from tuner.sim.bootstrap import engine_params
from tuner.sim.engine import EngineOOM, RequestTiming, SimRequest, StepTimeModel, run_closed_loop
from tuner.sim.flags import parse_flags
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script


@dataclass(frozen=True)
class VirtualScore:
    feasible: bool
    output_throughput: float  # tokens received within the window / window
    p99_ttft_ms: float
    reason: str = ""


def score_timings(timings: Sequence[RequestTiming], duration_s: float) -> tuple[float, float]:
    """(window output throughput, p99 TTFT ms) of a closed-loop run cut at `duration_s`."""
    tokens = sum(1 for t in timings for x in t.token_times_s if x <= duration_s)
    ttfts = sorted(
        (_first_token_by(t, duration_s) - t.start_s) * 1000
        for t in timings
        if t.start_s < duration_s
    )
    return tokens / duration_s, percentile(ttfts, 99) if ttfts else 0.0


def _first_token_by(t: RequestTiming, duration_s: float) -> float:
    """When the first token came, or the window's end for a request cut before it."""
    if t.first_token_s is not None and t.first_token_s <= duration_s:
        return t.first_token_s
    return duration_s


def virtual_trial(
    profile: str,
    flags: Mapping[str, object],
    concurrency: int,
    requests: Sequence[SimRequest],
    duration_s: float,
    p99_ttft_ms: float | None = None,
    seed: int = 0,
) -> VirtualScore:
    """Start-up verdict, then a closed loop of `duration_s` virtual seconds, scored and judged."""
    ns = parse_flags([*flag_args(flags), "--sim-profile", profile, "--sim-seed", str(seed)])
    prof = load_profile(profile)
    script = build_script(ns, prof)
    if script.failure is not None or script.plan is None:
        why = (
            script.failure.lines[-1].text if script.failure and script.failure.lines else "start-up"
        )
        return VirtualScore(False, 0.0, 0.0, f"start failed: {why}")
    params = engine_params(ns, script, prof)
    timing = StepTimeModel.from_mapping(prof.timing)
    try:
        timings = run_closed_loop(
            params, timing, script.plan.bytes_per_token, requests, concurrency, seed, duration_s
        )
    except EngineOOM as exc:
        return VirtualScore(False, 0.0, 0.0, f"died under load: {exc}")
    tput, ttft = score_timings(timings, duration_s)
    if p99_ttft_ms is not None and ttft > p99_ttft_ms:
        return VirtualScore(False, tput, ttft, "missed SLO: ttft")
    return VirtualScore(True, tput, ttft)
