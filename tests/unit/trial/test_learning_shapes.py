"""What a speculative or DP-attention trial's failure teaches, live and recalled from the study:
a CUDA-graph OOM or a death under load predicts another only for the same memory flags
(`capacity.precheck.MEMORY_FLAGS`: the speculative flags, the draft's path, dp and DP
attention among them), and a start calibrates only its own layout."""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, create_trial

from tuner.capacity.precheck import Hardware, Knowledge, precheck
from tuner.outcome import Attr, Status
from tuner.sglang.flags import effective_flags
from tuner.trial.learning import learned_failure, recalled

SERVER = {
    "model-path": "/models/kimi",
    "tp": 8,
    "speculative-algorithm": "EAGLE3",
    "speculative-draft-model-path": "/models/kimi-eagle3",
    "speculative-eagle-topk": 1,
}
HW = Hardware(bytes_per_token=70_272, gpu_mem_mib=97_887, host_ram_gb=449)


def flags_for(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's launch flags: the fixed ones, its server params (not the client's)."""
    server = {k: v for k, v in params.items() if k != "concurrency"}
    return effective_flags({**SERVER, **server})


def _trial(number: int, params: dict[str, Any], status: str, **attrs: Any) -> FrozenTrial:
    dists = {
        "mem-fraction-static": FloatDistribution(0.5, 0.99),
        "speculative-num-steps": IntDistribution(1, 8),
        "dp": IntDistribution(1, 8),
        "enable-dp-attention": CategoricalDistribution([False, True]),
        "concurrency": IntDistribution(1, 512),
    }
    t = create_trial(
        params=params,
        distributions={k: dists[k] for k in params},
        value=0.0,
        user_attrs={Attr.STATUS: status, Attr.LAUNCHED: True, **attrs},
    )
    t.number = number
    return t


def test_a_graph_oom_with_a_draft_bounds_that_draft_only() -> None:
    failed = {"mem-fraction-static": 0.90, "speculative-num-steps": 3, "concurrency": 32}
    trials = [_trial(0, failed, Status.START_FAILED, **{Attr.FAILURE: "oom_cuda_graph"})]
    know = recalled(Knowledge(), trials, flags_for)
    assert know == learned_failure(Knowledge(), "oom_cuda_graph", flags_for(failed), 0)
    higher = flags_for({**failed, "mem-fraction-static": 0.92})
    v = precheck(higher, HW, know)
    assert not v.feasible and v.kind == "oom_cuda_graph" and "(trial 0)" in v.reason
    # more draft steps capture other graphs (bs x draft tokens): not predicted
    assert precheck(flags_for({**failed, "speculative-num-steps": 5}), HW, know).feasible
    # lower mfs: more headroom for the graphs
    assert precheck(flags_for({**failed, "mem-fraction-static": 0.88}), HW, know).feasible


def test_a_death_under_dp_attention_is_recalled_for_that_layout() -> None:
    died = {
        "mem-fraction-static": 0.90,
        "speculative-num-steps": 3,
        "dp": 8,
        "enable-dp-attention": True,
        "concurrency": 128,
    }
    trials = [_trial(3, died, Status.DIED, **{Attr.FAILURE: "oom_runtime"})]
    know = recalled(Knowledge(), trials, flags_for)
    assert [(m, c, n) for _, m, c, n in know.deaths] == [(0.90, 128, 3)]
    same = flags_for({**died, "mem-fraction-static": 0.93})
    v = precheck(same, HW, know, concurrency=160)
    assert not v.feasible and v.kind == "oom_runtime"
    assert precheck(same, HW, know, concurrency=64).feasible  # below where it died
    replicas = flags_for({**died, "enable-dp-attention": False, "mem-fraction-static": 0.93})
    assert precheck(replicas, HW, know, concurrency=160).feasible  # another layout
    fewer = flags_for({**died, "dp": 4, "mem-fraction-static": 0.93})
    assert precheck(fewer, HW, know, concurrency=160).feasible  # another split


def test_a_recalled_start_calibrates_its_own_layout() -> None:
    plain = {
        "mem-fraction-static": 0.85,
        "speculative-num-steps": 3,
        "dp": 1,
        "enable-dp-attention": False,
        "concurrency": 8,
    }
    dp = {**plain, "dp": 8, "enable-dp-attention": True}
    info = {"max_total_num_tokens": 116_171, "mem_fraction_static": 0.85}
    trials = [_trial(0, plain, Status.OK, **{Attr.SERVER_INFO: info})]
    know = recalled(Knowledge(), trials, flags_for)
    assert know.calibration_for(flags_for(plain)) == (116_171, 0.85)
    assert know.calibration_for(flags_for(dp)) is None
    # what the runner learned live (no flags) and the study's record agree: one entry each
    assert recalled(know, trials, flags_for) == know
