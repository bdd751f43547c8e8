"""The simulator's start-up model: capacity/calculus.py agreement, failure verdicts, log lines, profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.capacity import calculus as capacity
from tuner.errors import InputFileError
from tuner.sglang.defaults import default_mem_fraction_static
from tuner.sim.flags import parse_flags
from tuner.sim.profile import load_profile, profile_names
from tuner.sim.startup import EXIT_CHILD_FAILED, EXIT_MAIN_EXCEPTION, build_script, plan_memory

PROFILES = ("kimi-k2.5-tp8", "llama-3.1-8b-h100", "qwen2.5-7b-l4")
TP = {"kimi-k2.5-tp8": 8, "llama-3.1-8b-h100": 1, "qwen2.5-7b-l4": 1}


def script_for(profile: str, *flags: str):
    ns = parse_flags(["--model-path", "m", "--tp-size", str(TP[profile]), *flags])
    return build_script(ns, load_profile(profile))


def test_shipped_profiles():
    assert set(PROFILES) <= set(profile_names())


def test_kimi_calibration_point():
    s = script_for("kimi-k2.5-tp8", "--mem-fraction-static", "0.85")
    assert s.failure is None
    assert s.plan.max_total_num_tokens == 116_171
    assert s.plan.bytes_per_token == 70_272 and s.plan.kv_kind == "mla"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mfs", [0.7, 0.75, 0.8, 0.85, 0.9])
def test_pool_agrees_with_capacity(profile, mfs):
    p = load_profile(profile)
    tp = TP[profile]
    plan = plan_memory(p, tp=tp, mfs=mfs, chunked_prefill_size=8192, cuda_graph_max_bs=64)
    bpt = capacity.kv_layout(p.model_config, tp).bytes_per_token
    expected = capacity.pool_tokens(
        mfs, p.free_at_init_mib * 2**20, (p.weights_gib(tp) + p.other_gib) * 2**30, bpt
    )
    assert plan.max_total_num_tokens == expected
    assert plan.max_running_requests == capacity.max_running_requests(expected, p.context_len())


def test_defaults_follow_gpu_size():
    s = script_for("llama-3.1-8b-h100")
    assert s.defaults.mem_fraction_static == default_mem_fraction_static(81559, 1)
    assert (s.defaults.chunked_prefill_size, s.defaults.cuda_graph_max_bs) == (8192, 256)
    q = script_for("qwen2.5-7b-l4")
    assert (q.defaults.chunked_prefill_size, q.defaults.cuda_graph_max_bs) == (2048, 24)


def _verdicts(profile: str, *flags: str) -> dict[float, str]:
    out = {}
    for i in range(50, 100):
        mfs = i / 100
        s = script_for(profile, "--mem-fraction-static", str(mfs), *flags)
        out[mfs] = s.plan.verdict if s.plan else "args"
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_verdicts_are_ordered_by_mfs(profile):
    order = ["not_enough_memory", "ok", "band", "graph_oom", "kv_oom"]
    seen = [order.index(v) for v in _verdicts(profile).values()]
    assert seen == sorted(seen)
    assert {"ok", "band", "graph_oom"} <= set(_verdicts(profile).values())


def _first(verdicts: dict[float, str], name: str) -> float:
    return min(m for m, v in verdicts.items() if v == name)


def test_cliff_moves_with_graph_bs_and_chunk():
    base = _verdicts("llama-3.1-8b-h100")
    big_bs = _verdicts("llama-3.1-8b-h100", "--cuda-graph-max-bs", "1024")
    big_chunk = _verdicts("llama-3.1-8b-h100", "--chunked-prefill-size", "16384")
    assert _first(big_bs, "graph_oom") < _first(base, "graph_oom")
    assert _first(big_chunk, "band") < _first(base, "band")


def test_band_sets_oom_prefill_tokens():
    v = _verdicts("kimi-k2.5-tp8")
    mfs = _first(v, "band")
    s = script_for("kimi-k2.5-tp8", "--mem-fraction-static", str(mfs))
    assert s.failure is None and 0 < s.plan.oom_prefill_tokens < s.defaults.chunked_prefill_size
    ok = script_for("kimi-k2.5-tp8", "--mem-fraction-static", "0.85")
    assert ok.plan.oom_prefill_tokens is None


def test_not_enough_memory_message():
    s = script_for("qwen2.5-7b-l4", "--mem-fraction-static", "0.6")
    text = "\n".join(line.text for line in s.failure.lines)
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value:"
        in text
    )
    assert "0.6" in text
    assert s.failure.exit_code == EXIT_CHILD_FAILED
    assert "Received sigquit from a child process" in s.failure.lines[-1].text


def test_graph_oom_message_and_timing():
    s = script_for("llama-3.1-8b-h100", "--mem-fraction-static", "0.98")
    text = "\n".join(line.text for line in s.failure.lines)
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in text
    assert "--cuda-graph-max-bs" in text
    printed = [line.text for ph in s.phases for line in ph.lines]
    assert any(t.startswith("KV Cache is allocated") for t in printed)  # after the KV pool
    assert s.failure.exit_code == EXIT_CHILD_FAILED


def test_hicache_host_memory_is_per_rank_times_tp():
    # 60 GB per rank fits one rank of a 449 GB host, not eight of them
    s = script_for("kimi-k2.5-tp8", "--enable-hierarchical-cache", "--hicache-size", "60")
    text = s.failure.lines[-3].text
    assert text.startswith(
        "ValueError: Not enough host memory available. Requesting 60.00 GB but only have"
    )
    assert text.endswith("Please reduce the size of the hierarchical cache.")
    assert s.failure.at >= max(ph.at for ph in s.phases)  # late: after graphs
    assert any("Capture cuda graph end" in line.text for ph in s.phases for line in ph.lines)
    ok = script_for("kimi-k2.5-tp8", "--enable-hierarchical-cache", "--hicache-size", "40")
    assert ok.failure is None and ok.hicache.host_tokens == -(-40 * 10**9 // 70272)
    verdict = capacity.hicache_verdict(
        60, 70272, s.plan.max_total_num_tokens, (449 - 25) * 1e9, ranks=8
    )
    assert not verdict.feasible


def test_hicache_host_pool_must_exceed_device_pool():
    s = script_for("kimi-k2.5-tp8", "--enable-hierarchical-cache", "--hicache-size", "5")
    assert any(
        "AssertionError: The host memory should be larger than the device memory" in line.text
        for line in s.failure.lines
    )
    r = script_for("llama-3.1-8b-h100", "--enable-hierarchical-cache", "--hicache-ratio", "1.0")
    assert r.failure is not None and r.failure.exit_code == EXIT_CHILD_FAILED


def test_hicache_with_disabled_radix_fails_at_once():
    s = script_for("llama-3.1-8b-h100", "--enable-hierarchical-cache", "--disable-radix-cache")
    assert s.failure.at == 0 and s.phases == () and s.failure.exit_code == EXIT_MAIN_EXCEPTION
    assert s.failure.lines[0].text.startswith(
        "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache"
    )


def test_success_log_lines():
    s = script_for("kimi-k2.5-tp8", "--mem-fraction-static", "0.85")
    printed = [line.text for ph in s.phases for line in ph.lines]
    assert any(
        t.startswith(
            "Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem="
        )
        and t.endswith(" GB.")
        for t in printed
    )
    assert "KV Cache is allocated. #tokens: 116171, KV size: 7.60 GB" in printed
    last = printed[-1]
    assert last.startswith(
        "max_total_num_tokens=116171, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests="
    )
    assert "context_len=262144, available_gpu_mem=" in last
    mha = [line.text for ph in script_for("llama-3.1-8b-h100").phases for line in ph.lines]
    assert any(", K size: " in t and ", V size: " in t for t in mha)


def test_max_total_tokens_only_lowers():
    s = script_for("llama-3.1-8b-h100", "--max-total-tokens", "1000", "--page-size", "16")
    assert s.plan.max_total_num_tokens == 992
    big = script_for("llama-3.1-8b-h100", "--max-total-tokens", "10000000")
    assert (
        big.plan.max_total_num_tokens == script_for("llama-3.1-8b-h100").plan.max_total_num_tokens
    )


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (
            lambda t: t.replace("gpu_mem_mib: 81559", "gpu_mem_mib: lots"),
            "gpu_mem_mib: expected a finite number",
        ),
        (lambda t: t + "bogus_key: 1\n", "bogus_key: unknown key"),
        (lambda t: t.replace("tp: 1\n", ""), "tp: missing"),
        (
            lambda t: t.replace("model_config: llama-3.1-8b", "model_config: no-such-model"),
            "model_config: cannot read",
        ),
        (lambda t: t.replace("  graph_mib_per_bs: 2.5\n", ""), "graph_memory.graph_mib_per_bs"),
        (lambda t: t + "  : [\n", "not valid YAML"),
        # found by fuzzing: a traceback, a study that never ended, noise that went negative
        (
            lambda t: t.replace("gpu_mem_mib: 81559", "gpu_mem_mib: 1.0e+308"),
            "gpu_mem_mib: expected a finite number",
        ),
        (lambda t: t.replace("hbm_gbps: 3350\npcie", "hbm_gbps: .nan\npcie"), "hbm_gbps"),
        (
            lambda t: t.replace("prefill_us_per_token: 22", "prefill_us_per_token: 1.0e+308"),
            "timing.prefill_us_per_token: expected a number in 0..",
        ),
        (lambda t: t.replace("noise_run_pct: 2.0", "noise_run_pct: 500"), "timing.noise_run_pct"),
        (lambda t: t.replace("hbm_efficiency: 0.8", "hbm_efficiency: 8"), "timing.hbm_efficiency"),
    ],
)
def test_bad_profile_is_one_line_naming_file_and_key(tmp_path, edit, fragment):
    src = load_profile("llama-3.1-8b-h100").source
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(Path(src).read_text()))
    with pytest.raises(InputFileError) as err:
        load_profile(str(bad))
    msg = str(err.value)
    assert msg.startswith(str(bad)) and fragment in msg and "\n" not in msg


def test_unknown_profile_name():
    with pytest.raises(InputFileError, match="no such simulator profile"):
        load_profile("no-such-profile")


def test_a_profiles_relative_model_config_is_read_beside_the_profile(tmp_path, monkeypatch):
    """A held-out profile kept with its own config.json works from any cwd (the server runs
    from the study's workdir or /tmp): `model_config: ../cfg/m.json` is the profile's path."""
    shipped = Path(load_profile("llama-3.1-8b-h100").source)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "m.json").write_text(
        (shipped.parents[2] / "model_configs" / "llama-3.1-8b.json").read_text()
    )
    (tmp_path / "profiles").mkdir()
    text = shipped.read_text().replace("model_config: llama-3.1-8b", "model_config: ../cfg/m.json")
    assert "../cfg/m.json" in text
    (tmp_path / "profiles" / "p.yaml").write_text(text)
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")  # ../cfg/m.json from here: a/cfg, no such file
    assert (
        load_profile(str(tmp_path / "profiles" / "p.yaml")).model_config["num_hidden_layers"] == 32
    )
