"""DP attention and speculative decoding in virtual time, on the Kimi-K2.5 TP8 profile: what they
do to running requests and throughput, from the same start-up plan and engine the HTTP simulator
uses, and a `tuner tune --virtual` study over them. Seeded throughout."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from tuner.api import tune
from tuner.config.load import parse_study
from tuner.outcome import Attr, Status
from tuner.server.launch import flag_args
from tuner.sim.bootstrap import engine_params
from tuner.sim.engine import SimRequest, StepTimeModel, new_engine
from tuner.sim.flags import parse_flags
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script
from tuner.sim.virtual.study import virtual_seams
from tuner.sim.virtual.trial import virtual_trial
from tuner.verdict.trials import completed

PROFILE = "kimi-k2.5-tp8"
BASE = {"model-path": "moonshotai/Kimi-K2.5", "tp-size": 8}
DP8 = {"enable-dp-attention": True, "dp-size": 8}
EAGLE3 = {
    "speculative-algorithm": "EAGLE3",
    "speculative-draft-model-path": "AQ-MedAI/Kimi-K25-eagle3",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
}


def requests(n: int, lo: int, hi: int, out_lo: int, out_hi: int) -> list[SimRequest]:
    rng = random.Random(1)
    return [
        SimRequest(
            tuple(rng.randrange(1000, 101000) for _ in range(rng.randint(lo, hi))),
            rng.randint(out_lo, out_hi),
        )
        for _ in range(n)
    ]


#: the seed case's traffic: 2-4k tokens a request
SEED_CASE = requests(1200, 1000, 2500, 500, 1500)
#: short requests: a pool of 116k tokens holds ~200 of them
SHORT = requests(2000, 300, 600, 100, 300)


def running_and_throughput(flags: dict, concurrency: int, seconds: float = 240.0):
    """(mean running requests, output tokens/s) over the second half of a closed loop."""
    ns = parse_flags([*flag_args({**BASE, **flags}), "--sim-profile", PROFILE, "--sim-seed", "1"])
    profile = load_profile(PROFILE)
    script = build_script(ns, profile)
    assert script.failure is None, script.failure
    timing = StepTimeModel.from_mapping(profile.timing)
    eng = new_engine(engine_params(ns, script, profile), timing, script.plan.bytes_per_token, 1)
    reqs = SEED_CASE
    for i in range(concurrency):
        eng.add_request(str(i), reqs[i].input_ids, reqs[i].max_new_tokens)
    nxt, running, gen0 = concurrency, [], None
    while eng.clock_s < seconds:
        _, out = eng.advance()
        for _ in out.finished:
            r = reqs[nxt % len(reqs)]
            eng.add_request(str(nxt), r.input_ids, r.max_new_tokens)
            nxt += 1
        if eng.clock_s >= seconds / 2:
            if gen0 is None:
                gen0, t0 = eng.stats().generation_tokens_total, eng.clock_s
            running.append(eng.stats().num_running_reqs)
    tput = (eng.stats().generation_tokens_total - gen0) / (eng.clock_s - t0)
    return statistics.mean(running), tput


def test_dp8_cannot_start_at_mfs_085_on_kimi():
    """The replicated attention weights (8.55 GiB a GPU) exceed the 7.6 GiB the pool had."""
    score = virtual_trial(
        PROFILE, {**BASE, **DP8, "mem-fraction-static": 0.85}, 400, SEED_CASE, 60.0, seed=1
    )
    assert not score.feasible and "child process" in score.reason
    ns = parse_flags([*flag_args({**BASE, **DP8}), "--sim-profile", PROFILE])
    ns.mem_fraction_static = 0.85
    script = build_script(ns, load_profile(PROFILE))
    assert script.plan.verdict == "not_enough_memory"


def test_dp8_runs_eight_times_the_requests_of_the_same_per_gpu_pool():
    """Kimi TP8, a pool-bound load (concurrency 400 of 2-4k-token requests), the same KV pool a
    GPU (--max-total-tokens) with and without DP attention: every GPU holds only its group's
    requests, so ~8x as many run; throughput rises with them."""
    same = {"mem-fraction-static": 0.92, "cuda-graph-max-bs": 64, "max-total-tokens": 60_000}
    tp_running, tp_tput = running_and_throughput(same, 400)
    dp_running, dp_tput = running_and_throughput({**same, **DP8}, 400)
    print(f"TP8 {tp_running:.0f} running {tp_tput:.0f} tok/s; DP8 {dp_running:.0f}, {dp_tput:.0f}")
    assert 6.5 <= dp_running / tp_running <= 8.5
    assert dp_tput > 1.5 * tp_tput


def test_dp8_at_the_mfs_it_starts_with_beats_tp8_at_high_concurrency_only():
    """At mfs 0.92 (graph batch 64 for both) DP 8's pools hold ~3x the requests of TP 8's
    replicated one: more throughput at concurrency 400; at concurrency 8 the replicated
    attention weights and the groups' sync make every step slower."""
    flags = {"mem-fraction-static": 0.92, "cuda-graph-max-bs": 64}
    tp = {c: running_and_throughput(flags, c) for c in (8, 400)}
    dp = {c: running_and_throughput({**flags, **DP8}, c) for c in (8, 400)}
    assert dp[400][0] > 2.5 * tp[400][0]
    assert dp[400][1] > 1.05 * tp[400][1]
    assert dp[8][1] < tp[8][1]


@pytest.mark.parametrize("concurrency", [1, 8])
def test_speculation_helps_at_low_concurrency(concurrency):
    for reqs in (SEED_CASE, SHORT):
        plain = virtual_trial(
            PROFILE, {**BASE, "mem-fraction-static": 0.85}, concurrency, reqs, 120.0, seed=1
        )
        spec = virtual_trial(
            PROFILE,
            {**BASE, "mem-fraction-static": 0.85, **EAGLE3},
            concurrency,
            reqs,
            120.0,
            seed=1,
        )
        assert plain.feasible and spec.feasible
        assert spec.output_throughput > 1.25 * plain.output_throughput


def test_speculation_hurts_at_high_concurrency():
    """Short requests at concurrency 256: TP 8 runs ~200 of them; under speculation SGLang runs
    48 unless told otherwise, and told 512, each verify of 4 tokens a request costs more than
    the 2.6 tokens it keeps (chat) at that batch, and far more at the acceptance of random
    prompts."""
    base = {**BASE, "mem-fraction-static": 0.85}
    plain = virtual_trial(PROFILE, base, 256, SHORT, 150.0, seed=1).output_throughput
    default = virtual_trial(PROFILE, {**base, **EAGLE3}, 256, SHORT, 150.0, seed=1)
    told = {**base, **EAGLE3, "max-running-requests": 512, "cuda-graph-max-bs": 128}
    random_kind = {**told, "sim-acceptance": "random"}
    assert default.output_throughput < 0.85 * plain
    assert virtual_trial(PROFILE, random_kind, 256, SHORT, 150.0, seed=1).output_throughput < plain


def test_a_virtual_study_over_both_levers(tmp_path: Path):
    """`tuner tune --virtual` with speculation on and DP attention searched (SGLang turns DP
    attention off at dp-size 1, so the flag is only sampled with dp-size 8)."""
    study = {
        "study": "levers",
        "target": {
            "host": "local",
            "launch": ["{python}", "-m", "tuner.sim", "--sim-profile", PROFILE],
        },
        "server": {**BASE, "tensor-parallel-size": 8, **EAGLE3, "cuda-graph-max-bs": 64},
        "space": {
            "mem-fraction-static": {"low": 0.88, "high": 0.93, "step": 0.01},
            "dp-size": {"choices": [1, 8]},
            "enable-dp-attention": {"choices": [True], "when": {"dp-size": {"gt": 1}}},
            "concurrency": {"choices": [8, 150]},
        },
        "workload": {"kind": "random", "input_len": 2000, "output_len": 1000, "duration_s": 60},
        "budget": {"n_trials": 6, "confirm_top": 1, "confirm_repeats": 1},
    }
    study["server"].pop("tp-size")
    cfg = parse_study(study, "levers.yaml")
    result = tune(cfg, runs_dir=tmp_path, seed=5, make_seams=virtual_seams(5))
    trials = completed(result.study)
    statuses = {t.user_attrs[Attr.STATUS] for t in trials}
    assert Status.OK in statuses
    measured = [t for t in trials if t.user_attrs[Attr.STATUS] == Status.OK]
    assert {t.params["dp-size"] for t in measured} == {1, 8}
    assert (tmp_path / "levers" / "best.yaml").is_file()
