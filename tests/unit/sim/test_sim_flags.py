"""The simulator's SGLang flag parser: names, types, choices, prefixes, --config merging."""

from __future__ import annotations

import pytest

from tests.helpers.paths import REPO
from tuner.errors import InputFileError
from tuner.sglang.flags import KNOWN_VERSIONS
from tuner.sim.flags import MODELED, FlagError, parse_flags, server_args_dict


def test_defaults_match_sglang():
    ns = parse_flags(["--model-path", "m"])
    assert (ns.host, ns.port, ns.page_size, ns.max_prefill_tokens) == ("127.0.0.1", 30000, 1, 16384)
    assert ns.schedule_policy == "fcfs" and ns.schedule_conservativeness == 1.0
    assert ns.hicache_ratio == 2.0 and ns.hicache_size == 0
    assert ns.hicache_write_policy == "write_through" and ns.hicache_io_backend == "kernel"
    assert ns.mem_fraction_static is None and ns.chunked_prefill_size is None
    assert ns.decode_log_interval == 40 and ns.stream_interval == 1
    assert ns.tp_size == 1 and ns.dp_size == 1


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["--tp", "8"], "tp_size", 8),
        (["--tp-size", "4"], "tp_size", 4),
        (["--tensor-parallel-size", "2"], "tp_size", 2),
        (["--dp", "2"], "dp_size", 2),
        (["--model", "x"], "model_path", "x"),
        (["--mem-fraction-static", "0.85"], "mem_fraction_static", 0.85),
        (["--kv-cache-dtype", "fp8_e4m3"], "kv_cache_dtype", "fp8_e4m3"),
        (["--cuda-graph-bs", "1", "2", "4"], "cuda_graph_bs", [1, 2, 4]),
        (["--enable-hierarchical-cache"], "enable_hierarchical_cache", True),
    ],
)
def test_real_names_and_prefixes(argv, key, value):
    ns = parse_flags(["--model-path", "m", *argv])
    assert getattr(ns, key) == value


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--hicache-size", "1.5"], "invalid int value: '1.5'"),
        (["--schedule-policy", "best"], "invalid choice: 'best'"),
        (["--mem_fraction_static", "0.8"], "unrecognized arguments"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (
            ["--sim-fault", "crash"],
            "argument --sim-fault: unknown fault kind 'crash'",
        ),  # no such flag
        (["--sim-startup-seconds", "-1"], "must be >= 0"),
        # found by fuzzing: these were OverflowError tracebacks in the capacity math
        (["--tp-size", "9" * 40], "invalid int value: 99999999999999999999... (too large)"),
        (["--chunked-prefill-size", "9" * 30], "(too large)"),
        (["--mem-fraction-static", "inf"], "invalid float value: 'inf' (not finite)"),
    ],
)
def test_bad_values_are_argparse_errors(argv, fragment):
    with pytest.raises(FlagError) as err:
        parse_flags(["--model-path", "m", *argv])
    assert fragment in err.value.message
    assert err.value.message.startswith("launch_server.py: error:")


def test_model_path_is_required():
    with pytest.raises(FlagError, match="--model-path"):
        parse_flags(["--port", "1"])


def test_config_file_merges_like_sglang(tmp_path):
    cfg = tmp_path / "best.yaml"
    cfg.write_text(
        "model-path: meta-llama/Llama-3.1-8B\nmem-fraction-static: 0.8\ntensor-parallel-size: 2\n"
        "enable-metrics: true\ndisable-radix-cache: false\ncuda-graph-bs: [1, 2, 8]\n"
    )
    ns = parse_flags(["--config", str(cfg), "--mem-fraction-static", "0.7"])
    assert ns.model_path == "meta-llama/Llama-3.1-8B"
    assert ns.mem_fraction_static == 0.7  # the command line overrides the file
    assert ns.tp_size == 2 and ns.enable_metrics is True and ns.disable_radix_cache is False
    assert ns.cuda_graph_bs == [1, 2, 8]
    assert ns.config == str(cfg)


def test_config_with_underscored_key_is_an_unknown_flag(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model-path: m\nmem_fraction_static: 0.8\n")
    with pytest.raises(FlagError, match="--mem_fraction_static"):
        parse_flags([f"--config={cfg}"])


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("c.json", "{}", "must be YAML"),
        ("c.yaml", "- a\n- b\n", "mapping at its root"),
        ("c.yaml", "model-path: [unclosed\n", "not valid YAML"),
        ("c.yaml", "model-path: m\nenable-metrics: 3\n", "enable-metrics: expected true or false"),
    ],
)
def test_bad_config_files_name_the_file(tmp_path, name, text, fragment):
    cfg = tmp_path / name
    cfg.write_text(text)
    with pytest.raises(InputFileError) as err:
        parse_flags(["--config", str(cfg)])
    assert str(cfg) in str(err.value) and fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(InputFileError, match="cannot read"):
        parse_flags(["--config", str(tmp_path / "nope.yaml")])


def test_server_args_use_sglang_field_names():
    args = server_args_dict(parse_flags(["--model-path", "m", "--tp", "8", "--sim-seed", "3"]))
    assert args["tp_size"] == 8 and "tensor_parallel_size" not in args
    assert not any(k.startswith("sim_") for k in args)


def test_every_modeled_flag_is_on_the_namespace_of_every_version() -> None:
    for version in KNOWN_VERSIONS:
        ns = parse_flags(["--model-path", "m", "--sim-sglang-version", version])
        assert [name for name in sorted(MODELED) if not hasattr(ns, name)] == [], version


def test_a_profile_naming_a_version_without_a_table_is_one_line(tmp_path):
    shipped = REPO / "tuner/sim/profiles/llama-3.1-8b-h100.yaml"
    profile = tmp_path / "p.yaml"
    profile.write_text(shipped.read_text().replace("version: 0.5.6.post2", "version: 0.4.0"))
    with pytest.raises(FlagError) as err:
        parse_flags(["--model-path", "m", "--sim-profile", str(profile)])
    assert err.value.message == (
        f"launch_server.py: error: profile {profile} names SGLang 0.4.0; the simulator plays "
        "0.5.6.post2, 0.5.23 (--sim-sglang-version)"
    )
    ns = parse_flags(
        ["--model-path", "m", "--sim-profile", str(profile), "--sim-sglang-version", "0.5.23"]
    )
    assert ns.sim_sglang_version == "0.5.23"  # naming the version played overrides the profile
