"""Search space -> distributions and flags; the pre-check's verdicts; launch rendering."""

from __future__ import annotations

import shlex

import optuna
import pytest
import yaml

from tests.helpers.studies import study_dict
from tuner.capacity import calculus as cap
from tuner.capacity.precheck import Hardware, Knowledge, precheck, projected_tokens
from tuner.config.load import parse_study
from tuner.search.space import canonical, distributions, fingerprint, sample, server_flags
from tuner.server.launch import (
    build_launch,
    flag_args,
    redact_argv,
    render_sglang_yaml,
    shown_command,
)


def cfg(space, **kw):
    return parse_study(study_dict(space=space, **kw))


def test_float_step_range_is_snapped_for_optuna() -> None:
    d = distributions(cfg({"mem-fraction-static": {"low": 0.8, "high": 0.95, "step": 0.01}}).space)
    dist = d["mem-fraction-static"]
    assert isinstance(dist, optuna.distributions.FloatDistribution)
    assert dist.high == pytest.approx(0.95) and dist.step == 0.01


def test_conditional_param_sampled_only_when_active() -> None:
    c = cfg(
        {
            "hicache-size": {"choices": [0, 40]},
            "hicache-write-policy": {
                "choices": ["write_through", "write_back"],
                "when": {"hicache-size": {"gt": 0}},
            },
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = []
    for _ in range(20):
        t = study.ask()
        p = sample(t, c.space)
        seen.append(p)
        study.tell(t, 1.0)
    assert all(("hicache-write-policy" in p) == (p["hicache-size"] > 0) for p in seen)
    assert {p["hicache-size"] for p in seen} == {0, 40}


def test_server_flags_drop_client_params_and_hicache_when_off() -> None:
    from tuner.server.launch import effective_flags

    # the size stays in the trial's flags: HiCache on/off is settled over the whole flag set
    off = server_flags({"hicache-size": 0, "hicache-write-policy": "write_back", "concurrency": 64})
    assert off == {"hicache-size": 0, "hicache-write-policy": "write_back"}
    assert effective_flags(off) == {}
    on = server_flags({"hicache-size": 40, "mem-fraction-static": 0.9, "concurrency": 64})
    assert effective_flags(on) == {
        "hicache-size": 40,
        "mem-fraction-static": 0.9,
        "enable-hierarchical-cache": True,
    }


def test_canonical_ignores_float_noise_and_order() -> None:
    assert canonical({"a": 0.86, "b": 1}) == canonical({"b": 1, "a": 0.8600000000000001})


def test_fingerprint_changes_with_workload_not_with_budget() -> None:
    a = cfg({"concurrency": {"low": 1, "high": 8}})
    b = cfg({"concurrency": {"low": 1, "high": 8}}, budget={"n_trials": 99})
    c = cfg({"concurrency": {"low": 1, "high": 8}}, workload={"input_len": 7})
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a)["workload"] != fingerprint(c)["workload"]


KIMI = Hardware(bytes_per_token=70_272, gpu_mem_mib=97_887, host_ram_gb=449)


def test_precheck_rejects_hicache_beyond_host_ram_per_rank_times_tp() -> None:
    flags = {"tensor-parallel-size": 8, "mem-fraction-static": 0.85, "hicache-size": 300}
    v = precheck(flags, KIMI, Knowledge())
    assert not v.feasible and v.kind == "host_memory" and "2,400 GB" in v.reason
    assert precheck({**flags, "hicache-size": 50}, KIMI, Knowledge()).feasible


def test_fingerprint_reads_flags_under_their_canonical_names() -> None:
    """Renaming `tp` to `tensor-parallel-size` in the file is the same study (resume allowed)."""
    space = {"concurrency": {"low": 1, "high": 8}}
    a = cfg(space, server={"model-path": "m", "tp": 8})
    b = cfg(space, server={"model-path": "m", "tensor-parallel-size": 8})
    c = cfg(space, server={"model-path": "m", "tp": 4})
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a)["server"] != fingerprint(c)["server"]
    short = cfg({"mem-frac": {"low": 0.8, "high": 0.9}})
    full = cfg({"mem-fraction-static": {"low": 0.8, "high": 0.9}})
    assert fingerprint(short)["space"] == fingerprint(full)["space"]


def test_precheck_reads_tp_through_its_alias_without_a_model_config() -> None:
    """`tp: 8` is SGLang's TP 8 (argparse prefix of --tp-size), and the host-RAM half of the
    HiCache rule needs no bytes per token: 8 x 60 GB = 480 GB does not fit 449 GB."""
    ram_only = Hardware(host_ram_gb=449)
    v = precheck({"tp": 8, "hicache-size": 60}, ram_only, Knowledge())
    assert not v.feasible and v.kind == "host_memory" and "480 GB" in v.reason, v
    assert "54 GB per rank" in v.reason
    assert precheck({"tp": 8, "hicache-size": 54}, ram_only, Knowledge()).feasible
    assert precheck({"hicache-size": 60}, ram_only, Knowledge()).feasible  # TP 1


def test_precheck_host_pool_must_exceed_device_pool_once_calibrated() -> None:
    know = Knowledge().with_start(116_171, 0.85)
    flags = {"tensor-parallel-size": 8, "mem-fraction-static": 0.85, "hicache-size": 2}
    assert precheck(flags, KIMI, Knowledge()).feasible  # pool unknown: leave it to measurement
    v = precheck(flags, KIMI, know)
    assert not v.feasible and "not larger than the device pool" in v.reason


def test_precheck_never_rejects_hicache_on_a_pool_it_only_bounds_from_above() -> None:
    """Weights alone over-estimate the pool (nothing else counted, the total memory taken as
    free): the baseline of a held-out profile (DeepSeek-V2-Lite on an L40S, --hicache-size 9)
    was rejected as 'host pool not larger than the device pool' though it starts with 277,031
    device tokens against 289,352 host ones. A real start's pool, less the CUDA context's
    drift, is the only floor the rule may use."""
    bpt = 27 * (512 + 64) * 2  # MLA, bf16
    hw = Hardware(gpu_mem_mib=46_068, weights_gib=29.8, bytes_per_token=bpt, host_ram_gb=32)
    flags = {"mem-fraction-static": 0.85, "hicache-size": 9}
    assert projected_tokens(flags, hw, Knowledge()) > 289_352  # the over-estimate itself
    assert precheck(flags, hw, Knowledge()).feasible
    started = Knowledge().with_start(277_031, 0.85)  # the same mfs: no drift
    assert precheck(flags, hw, started).feasible
    assert not precheck({**flags, "hicache-size": 8}, hw, started).feasible  # 257k host tokens
    # a start at 0.80 (its real pool): projected to 0.85 over the stated total memory, ~850
    # tokens above the real 277,031; the floor takes ~1,700 of drift off
    near = Knowledge().with_start(200_231, 0.80)
    assert precheck(flags, hw, near).feasible
    assert not precheck({**flags, "hicache-size": 8}, hw, near).feasible


def test_precheck_no_pool_after_calibration() -> None:
    know = Knowledge().with_start(116_171, 0.85)
    v = precheck({"mem-fraction-static": 0.70}, KIMI, know)
    assert not v.feasible and v.kind == "not_enough_memory"
    expected = cap.pool_tokens(
        0.70, 97_887 * cap.MIB, 0.85 * 97_887 * cap.MIB - 116_171 * 70_272, 70_272
    )
    assert str(expected) in v.reason


def test_precheck_graph_failure_applies_only_to_same_memory_flags() -> None:
    know = Knowledge().with_graph_failure(
        {"mem-fraction-static": 0.93, "cuda-graph-max-bs": 256}, 4
    )
    assert not precheck(
        {"mem-fraction-static": 0.95, "cuda-graph-max-bs": 256}, KIMI, know
    ).feasible
    assert precheck({"mem-fraction-static": 0.92, "cuda-graph-max-bs": 256}, KIMI, know).feasible
    assert precheck({"mem-fraction-static": 0.95, "cuda-graph-max-bs": 64}, KIMI, know).feasible


def test_launch_quotes_and_renders_like_sglang() -> None:
    spec = build_launch(
        ["python", "-m", "sglang.launch_server"],
        {
            "model-path": "x; touch /tmp/owned",
            "enable-metrics": True,
            "disable-radix-cache": False,
            "api-key": "s3cret",
            "cuda-graph-bs": [1, 2, 4],
        },
        30123,
        {"HF_HOME": "/a b"},
    )
    cmd = spec.shell_command()
    assert "'x; touch /tmp/owned'" in cmd and "HF_HOME='/a b'" in cmd
    assert "--disable-radix-cache" not in cmd and "--cuda-graph-bs 1 2 4" in cmd
    assert "s3cret" not in " ".join(redact_argv(spec.argv))
    shown = shown_command(spec.argv)  # trials/<n>/launch.txt: pastes back as the same argv
    assert "s3cret" not in shown and shlex.split(shown) == redact_argv(spec.argv)
    text = render_sglang_yaml(spec.flags, ["header"])
    parsed = yaml.safe_load(text)
    assert parsed["enable-metrics"] is True and "api-key" not in parsed and parsed["port"] == 30123
    assert text.startswith("# header")
    assert flag_args({"a": 0.9, "b": None}) == ["--a", "0.9"]


def test_trial_zero_defaults_to_sglangs_own_defaults() -> None:
    from tuner.search.space import sglang_defaults

    c = cfg(
        {
            "mem-fraction-static": {"low": 0.8, "high": 0.95, "step": 0.01},
            "hicache-size": {"low": 0, "high": 50, "step": 10},
            "chunked-prefill-size": {"choices": [4096, 8192, 16384]},
            "cuda-graph-max-bs": {
                "choices": [64, 128]
            },  # SGLang's 256 is outside: left to the sampler
            "schedule-policy": {"choices": ["lpm", "fcfs"]},
            "concurrency": {"low": 8, "high": 256},
        },
        server={"model-path": "m", "tensor-parallel-size": 1},
    )
    d = sglang_defaults(c, 81_559)  # H100: SGLang computes mfs 0.835, chunk 8192, graph bs 256
    assert abs(d.pop("mem-fraction-static") - 0.835) <= 0.005 + 1e-9  # on the 0.01 grid
    assert d == {"hicache-size": 0, "chunked-prefill-size": 8192, "schedule-policy": "fcfs"}
    study = optuna.create_study()
    study.enqueue_trial(d)  # every value is on its distribution's grid
    t = study.ask()
    assert sample(t, c.space)["chunked-prefill-size"] == 8192
