"""SGLang's launch flags, fact by fact, against the tuner's tables and the simulator's parser.

Each fact names its source: the file in SGLang's repository (tag v0.5.6.post2 or v0.5.23; the
wheels `sglang-0.5.6.post2-py3-none-any.whl` and `sglang-0.5.23-cp311-...whl` hold the same
files under `sglang/`) and the line. The counts were taken by running each version's own
`ServerArgs.add_cli_args` on an argparse parser (issue 13; sglang-reference.md section 9).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tuner.check.flagset import flag_problem, help_options, version_problems
from tuner.errors import InputFileError
from tuner.sglang.argtypes import ACTIONS, known_type
from tuner.sglang.flags import (
    KNOWN_VERSIONS,
    Flag,
    add_to_parser,
    canonical_flag,
    flags_for,
    option_strings,
    server_fields,
    version_hint,
)
from tuner.sglang.tables import load
from tuner.sim.flags import FlagError, build_parser, parse_flags, server_args_dict

OLD, NEW = "0.5.6.post2", "0.5.23"
SA = "python/sglang/srt/server_args.py"
FIELDS = "python/sglang/srt/arg_groups/fields"


def sglang_parser(version: str) -> argparse.ArgumentParser:
    """SGLang's own parser for that version, as `prepare_server_args` builds it."""
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    add_to_parser(parser, version)
    return parser


def parse(version: str, *argv: str) -> argparse.Namespace:
    return parse_flags(["--model-path", "m", "--sim-sglang-version", version, *argv])


def error_of(version: str, *argv: str) -> str:
    with pytest.raises(FlagError) as err:
        parse(version, *argv)
    return err.value.message


# --- the whole table ---------------------------------------------------------------------


@pytest.mark.parametrize(("version", "count"), [(OLD, 300), (NEW, 559)])
def test_every_option_string_of_the_version(version: str, count: int) -> None:
    # 0.5.6.post2: 292 add_argument calls in ServerArgs.add_cli_args (server_args.py:2122);
    # 0.5.23: 531 arguments, 12 of them BooleanOptionalAction, which also registers --no-NAME
    strings = {s for a in sglang_parser(version)._actions for s in a.option_strings}
    assert len(strings - {"-h", "--help"}) == count
    assert len(option_strings(version) - {"help"}) == count
    sim = {s for a in build_parser(version)._actions for s in a.option_strings}
    assert {s for s in sim if not s.startswith("--sim-")} - {"-h", "--help"} == strings - {
        "-h",
        "--help",
    }


def _sample(flag: Flag) -> list[str]:
    """Values that flag accepts (none for a switch)."""
    if flag.action in ("store_true", "BooleanOptionalAction", "DeprecatedStoreTrueAction"):
        return []
    if flag.choices:
        value = str(flag.choices[0])
    else:
        value = {
            "int": "1",
            "float": "0.5",
            "json.loads": "{}",
            "json_list_type": "[]",
            "human_readable_int": "1k",
            "parse_cuda_graph_config_arg": "{}",
        }.get(flag.type_name, "x")
    return [value] * (flag.nargs if isinstance(flag.nargs, int) else 1)


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_the_simulator_accepts_every_flag_of_the_version(version: str) -> None:
    # before issue 13 it accepted 75 of 0.5.6.post2's 300 option strings
    parser = build_parser(version)
    base = ["--model-path", "m", "--sim-sglang-version", version]
    accepted = 0
    for flag in flags_for(version).values():
        for option in flag.registered:
            ns = parser.parse_args([*base, option, *_sample(flag)] if option != "--model" else base)
            assert hasattr(ns, flag.dest), option
            accepted += 1
    assert accepted == len(option_strings(version)) - 1  # all but --help


@pytest.mark.parametrize(("version", "count"), [(OLD, 291), (NEW, 546)])
def test_server_info_reports_every_server_arg(version: str, count: int) -> None:
    # /server_info is dataclasses.asdict(ServerArgs) in 0.5.6.post2 (http_server.py:557) and
    # ServerArgs.resolved_dict() in 0.5.23 (utils/common.py:3589): every field
    args = server_args_dict(parse(version, "--allow-auto-truncate"))
    assert list(args) == list(server_fields(version)) and len(args) == count
    assert args["allow_auto_truncate"] is True  # accepted, not modelled, reported
    assert "tensor_parallel_size" not in args and args["tp_size"] == 1


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_every_type_and_action_has_its_parser(version: str) -> None:
    # SGLang's own parsers (human_readable_int, nullable_str, json_list_type, ...) and actions
    # (BooleanOptionalAction, DeprecatedStoreTrueAction, LoRAPathAction, ...) are all known, so
    # no flag silently parses as a plain string
    flags = flags_for(version).values()
    assert [f.type_name for f in flags if f.type_name and not known_type(f.type_name)] == []
    assert {f.action for f in flags} - {None, "store_true", *ACTIONS} == set()


def test_the_extractor_evaluated_every_choice_but_one() -> None:
    # 0.5.23 server_args.py:387: --kv-canary-real-data's choices come from an enum of the
    # kernels package at run time; left open (any value accepted) rather than guessed
    assert load(OLD).unresolved == ()
    assert load(NEW).unresolved == (
        "--kv-canary-real-data choices: [m.name.lower() for m in _real_kv_hash_modes()]",
    )


# --- names: aliases, prefixes, ambiguity -------------------------------------------------


def test_cuda_graph_max_bs_is_ambiguous_in_0_5_23() -> None:
    # 0.5.23 fields/exec_.py:629 and :632 declare --cuda-graph-max-bs-decode and -prefill;
    # SGLang's parser is argparse with allow_abbrev (server_args.py:679), so the old name is a
    # prefix of both
    assert error_of(NEW, "--cuda-graph-max-bs", "8") == (
        "launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    assert parse(OLD, "--cuda-graph-max-bs", "8").cuda_graph_max_bs == 8  # server_args.py:3509
    ns = parse(NEW, "--cuda-graph-max-bs-decode", "64")
    assert ns.cuda_graph_max_bs_decode == 64 and ns.cuda_graph_max_bs == 64  # what the sim models
    assert "cuda_graph_max_bs" not in server_args_dict(ns)


def test_check_and_export_name_the_replacement() -> None:
    # `tuner check` reads the host's --help; the simulator's 0.5.23 help is SGLang 0.5.23's
    options = help_options(build_parser(NEW).format_help())
    problem = flag_problem("cuda-graph-max-bs", options)
    assert problem is not None and problem.startswith("ambiguous on the host's SGLang")
    assert "split it into --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill" in problem
    assert version_problems(["cuda-graph-max-bs", "mem-fraction-static", "tp"], NEW) == [
        "--cuda-graph-max-bs: ambiguous on SGLang 0.5.23 (could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill) (SGLang 0.5.23 split it into "
        "--cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill)"
    ]
    assert version_problems(["stream-output"], NEW) == [
        "--stream-output: SGLang 0.5.23 has no such flag (gone in SGLang 0.5.23)"
    ]  # 0.5.6.post2 server_args.py:2515; no 0.5.23 field
    assert version_problems(["cuda-graph-max-bs"], "0.4.0") == []  # no table: SGLang judges


def test_every_dropped_option_says_what_became_of_it() -> None:
    gone = option_strings(OLD) - option_strings(NEW)
    assert len(gone) == 35
    assert all(version_hint(name) for name in gone)


@pytest.mark.parametrize(
    ("version", "candidates"),
    [
        (OLD, "--pp-size, --pp-max-micro-batch-size"),  # server_args.py:2496, :2503
        (NEW, "--pp-size, --pp-max-micro-batch-size, --pp-async-batch-depth"),  # parallel.py:59
    ],
)
def test_pp_is_ambiguous_in_both_versions(version: str, candidates: str) -> None:
    assert error_of(version, "--pp", "2").endswith(f"--pp could match {candidates}")
    assert canonical_flag("pp", version) is None


@pytest.mark.parametrize(
    ("version", "src", "option_strings"),
    [
        # 0.5.6.post2: dest tensor_parallel_size, copied to tp_size by ServerArgs.from_cli_args
        (OLD, f"{SA}:2489", ("--tensor-parallel-size", "--tp-size")),
        (NEW, f"{FIELDS}/parallel.py:45", ("--tp-size", "--tensor-parallel-size")),
    ],
)
def test_tp_works_by_prefix(version: str, src: str, option_strings: tuple[str, str]) -> None:
    (flag,) = [f for f in flags_for(version).values() if f.option_strings == option_strings]
    assert flag.src == src
    for argv in (["--tp", "4"], ["--tp-size", "4"], ["--tensor-parallel-size", "4"]):
        ns = parse(version, *argv)
        assert ns.tp_size == 4 and server_args_dict(ns)["tp_size"] == 4


def test_enable_hicache_is_an_alias_in_0_5_23_only() -> None:
    # 0.5.23 fields/memory.py:98: aliases=["--enable-hicache"]
    assert parse(NEW, "--enable-hicache").enable_hierarchical_cache is True
    assert "unrecognized arguments: --enable-hicache" in error_of(OLD, "--enable-hicache")
    assert parse(OLD, "--enable-hierarchical-cache").enable_hierarchical_cache is True


def test_model_is_an_alias_and_model_path_is_required() -> None:
    # 0.5.6.post2 server_args.py:2125 ("--model-path", "--model", required=True)
    assert flags_for(OLD)["model-path"].src == f"{SA}:2125"
    assert parse_flags(["--model", "x"]).model_path == "x"
    with pytest.raises(FlagError, match="the following arguments are required: --model-path"):
        parse_flags(["--sim-sglang-version", NEW])


# --- types, choices, actions -------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "choices"),
    [
        (OLD, ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")),  # :2317
        (
            NEW,
            (
                "auto",
                "fp8_e5m2",
                "fp8_e4m3",
                "mxfp8",
                "bf16",
                "bfloat16",
                "nvfp4",
                "fp4_mx_block16",
            ),
        ),
    ],
)
def test_kv_cache_dtype_choices(version: str, choices: tuple[str, ...]) -> None:
    # 0.5.23: fields/model.py:197
    assert flags_for(version)["kv-cache-dtype"].choices == choices
    assert "argument --kv-cache-dtype: invalid choice: 'fp16'" in error_of(
        version, "--kv-cache-dtype", "fp16"
    )


def test_schedule_policy_choices() -> None:
    # 0.5.6.post2 server_args.py:2407; 0.5.23 fields/schedule.py:86
    assert flags_for(OLD)["schedule-policy"].choices == (
        *("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
    )
    assert flags_for(NEW)["schedule-policy"].choices == (
        *("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
        *("routing-key", "hrrn", "shortest-prefill-first"),
    )
    assert parse(NEW, "--schedule-policy", "hrrn").schedule_policy == "hrrn"
    assert "invalid choice: 'hrrn'" in error_of(OLD, "--schedule-policy", "hrrn")


def test_context_length_takes_32k_from_0_5_23() -> None:
    # 0.5.23 fields/model.py:110 type_parser=human_readable_int (utils/common.py:3394)
    assert flags_for(NEW)["context-length"].type_name == "human_readable_int"
    assert parse(NEW, "--context-length", "32k").context_length == 32000
    assert parse(NEW, "--max-total-tokens", "1Ki").max_total_tokens == 1024
    assert "invalid int value: '32k'" in error_of(OLD, "--context-length", "32k")  # :2198


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_hicache_size_is_an_int_in_gb(version: str) -> None:
    # 0.5.6.post2 server_args.py:3314; 0.5.23 fields/memory.py:113; both int, default 0
    assert flags_for(version)["hicache-size"].default == 0
    assert "argument --hicache-size: invalid int value: '1.5'" in error_of(
        version, "--hicache-size", "1.5"
    )


def test_store_true_takes_no_value() -> None:
    # 0.5.6.post2 server_args.py:2615 action="store_true"
    assert parse(OLD).enable_metrics is False and parse(OLD, "--enable-metrics").enable_metrics
    assert "unrecognized arguments: true" in error_of(OLD, "--enable-metrics", "true")


def test_boolean_optional_action_in_0_5_23() -> None:
    # fields/exec_.py:45 enable_tf32_matmul: Optional[bool], argparse.BooleanOptionalAction
    assert parse(NEW).enable_tf32_matmul is None
    assert parse(NEW, "--enable-tf32-matmul").enable_tf32_matmul is True
    assert parse(NEW, "--no-enable-tf32-matmul").enable_tf32_matmul is False


def test_deprecated_disable_cuda_graph_still_works_in_0_5_23(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # server_args.py:410 DeprecatedStoreTrueAction, new_flag --cuda-graph-backend-{decode,prefill}
    assert parse(NEW, "--disable-cuda-graph").disable_cuda_graph is True
    assert "'--disable-cuda-graph' is deprecated" in capsys.readouterr().err
    backend = parse(NEW, "--cuda-graph-backend-decode", "disabled")
    assert backend.disable_cuda_graph is True  # what the simulator models


def test_defaults_differ_between_versions() -> None:
    # --hicache-mem-layout: 0.5.6.post2 server_args.py:3334 layer_first; 0.5.23 memory.py:135
    assert parse(OLD).hicache_mem_layout == "layer_first"
    assert parse(NEW).hicache_mem_layout == "page_first"


# --- --config ----------------------------------------------------------------------------


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "best.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_config_store_true_keys(tmp_path: Path, version: str) -> None:
    # 0.5.6.post2 server_args_config_parser.py:128; 0.5.23 utils/server_args_config_parser.py
    # _add_boolean_arg: true -> the bare flag, false -> nothing
    cfg = _config(tmp_path, "model-path: m\nenable-metrics: true\ndisable-radix-cache: false\n")
    ns = parse_flags(["--config", cfg, "--sim-sglang-version", version])
    assert ns.enable_metrics is True and ns.disable_radix_cache is False


def test_config_booleans_of_valued_flags(tmp_path: Path) -> None:
    # 0.5.6.post2 server_args.py:4483 asks argparse actions for `.action`, which they lack, so
    # its merger's boolean list is empty: `false` drops any key. 0.5.23 writes `--key false`.
    cfg = _config(tmp_path, "model-path: m\nhicache-size: false\n")
    assert parse_flags(["--config", cfg, "--sim-sglang-version", OLD]).hicache_size == 0
    with pytest.raises(FlagError, match="argument --hicache-size: invalid int value: 'false'"):
        parse_flags(["--config", cfg, "--sim-sglang-version", NEW])


def test_config_refuses_switches_without_a_value_in_0_5_23(tmp_path: Path) -> None:
    # 0.5.23 utils/server_args_config_parser.py: actions taking no single value are refused,
    # `no-` spellings included (sglang-reference.md section 9)
    for key in ("no-enable-tf32-matmul", "enable-tf32-matmul"):
        cfg = _config(tmp_path, f"model-path: m\n{key}: true\n")
        with pytest.raises(InputFileError, match="Unsupported config option") as err:
            parse_flags(["--config", cfg, "--sim-sglang-version", NEW])
        assert "BooleanOptionalAction" in str(err.value)
    cfg = _config(tmp_path, "model-path: m\nenable-hicache: true\n")  # an alias is a key too
    assert parse_flags(["--config", cfg, "--sim-sglang-version", NEW]).enable_hierarchical_cache


# --- the played version -----------------------------------------------------------------


def test_the_played_version_defaults_to_the_profiles(tmp_path: Path) -> None:
    assert parse_flags(["--model-path", "m"]).sim_sglang_version == OLD  # the profiles name it
    profile = Path(__file__).parents[2] / "tuner/sim/profiles/llama-3.1-8b-h100.yaml"
    custom = tmp_path / "p.yaml"
    custom.write_text(profile.read_text().replace("version: 0.5.6.post2", f"version: {NEW}"))
    ns = parse_flags(["--model-path", "m", "--sim-profile", str(custom)])
    assert ns.sim_sglang_version == NEW and hasattr(ns, "cuda_graph_max_bs_decode")
    explicit = parse_flags(
        ["--model-path", "m", "--sim-profile", str(custom), "--sim-sglang-version", OLD]
    )
    assert explicit.sim_sglang_version == OLD


def test_an_unknown_played_version_is_a_usage_error() -> None:
    message = error_of("0.4.0")
    assert "argument --sim-sglang-version: invalid choice: '0.4.0'" in message
    assert "\n" not in message
