"""tuner.sglang.flags: SGLang's flag table per version, name resolution, defaults, argparse."""

from __future__ import annotations

import argparse

import pytest

from tuner.capacity.calculus import KV_DTYPES
from tuner.errors import ConfigError
from tuner.sglang.flags import (
    DEFAULT_VERSION,
    KNOWN_VERSIONS,
    DuplicateFlagError,
    UnknownVersionError,
    add_to_parser,
    canonical_flag,
    defaults,
    flags_for,
    normalize_flags,
    version_hint,
)
from tuner.sim.flags import FlagError, build_parser

NEW = "0.5.23"
GONE_IN_NEW = ("cuda-graph-max-bs", "cuda-graph-bs", "stream-output", "enable-piecewise-cuda-graph")
ADDED_IN_NEW = (
    "cuda-graph-max-bs-decode",
    "cuda-graph-max-bs-prefill",
    "cuda-graph-bs-decode",
    "cuda-graph-bs-prefill",
    "hicache-host-memory-fraction",
    "hicache-host-memory-mode",
)


def test_versions() -> None:
    assert DEFAULT_VERSION == "0.5.6.post2"
    assert KNOWN_VERSIONS == ("0.5.6.post2", "0.5.23")


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("tensor-parallel-size", "tensor-parallel-size"),
        ("tp-size", "tensor-parallel-size"),
        ("--tp-size", "tensor-parallel-size"),
        ("model", "model-path"),
        ("model-path", "model-path"),
        ("dp-size", "data-parallel-size"),
        ("mem-fraction-static", "mem-fraction-static"),
        ("tp", "tensor-parallel-size"),  # unique prefix of --tp-size, as argparse resolves it
        ("dp", "data-parallel-size"),
        ("mem-frac", "mem-fraction-static"),
        ("hicache-si", "hicache-size"),
    ],
)
def test_canonical_names_aliases_and_prefixes(name: str, canonical: str) -> None:
    assert canonical_flag(name) == canonical


@pytest.mark.parametrize(
    "name",
    [
        "mod",  # --model-path and --model: argparse counts option strings, so ambiguous
        "hicache",  # every --hicache-* flag
        "enable",
        "mem_fraction_static",  # SGLang's flags are dashed: the underscored name is unknown
        "no-such-flag",
        "",
        "help",  # argparse's own, not an SGLang flag
        "he",
        "cuda-graph-max-bs-decode",  # only in 0.5.23
    ],
)
def test_unknown_or_ambiguous_names(name: str) -> None:
    assert canonical_flag(name) is None


def test_help_counts_for_ambiguity_like_argparse() -> None:
    # --host is the only flag starting with "ho"; "h" also matches --help and --hicache-*
    assert canonical_flag("ho") == "host"
    assert canonical_flag("h") is None


def _set_by_argparse(option: str, *values: str) -> str | None:
    """The dest argparse sets for `--option` on the simulator's parser; None if it refuses it."""
    parser = build_parser()
    base = vars(parser.parse_args(["--model-path", "m"]))
    try:
        ns = vars(parser.parse_args(["--model-path", "m", f"--{option}", *values]))
    except FlagError:
        return None
    changed = [k for k, v in ns.items() if v != base[k] and not k.startswith("sim_")]
    assert len(changed) == 1
    return changed[0]


@pytest.mark.parametrize(
    ("option", "values"),
    [
        ("tp", ("2",)),
        ("dp", ("2",)),
        ("pp", ("2",)),
        ("mem-frac", ("0.5",)),
        ("schedule-p", ("lpm",)),
        ("disable-r", ()),
        ("mod", ("x",)),
        ("hicache", ("1",)),
        ("max", ("1",)),
    ],
)
def test_prefixes_agree_with_the_simulators_argparse(option: str, values: tuple[str, ...]) -> None:
    name = canonical_flag(option)
    expected = flags_for()[name].dest if name else None
    assert _set_by_argparse(option, *values) == expected


def test_normalize_flags_uses_canonical_names_in_order() -> None:
    given = {"tp": 2, "model": "m", "mem-fraction-static": 0.8, "enable-lora": True}
    assert list(normalize_flags(given).items()) == [
        ("tensor-parallel-size", 2),
        ("model-path", "m"),
        ("mem-fraction-static", 0.8),
        ("enable-lora", True),  # already canonical
    ]


@pytest.mark.parametrize(
    "given",
    [
        {"tp": 2, "tensor-parallel-size": 4},
        {"tp-size": 2, "tensor-parallel-size": 2},
        {"model": "a", "model-path": "b"},
    ],
)
def test_one_flag_under_two_names_is_an_error(given: dict[str, object]) -> None:
    with pytest.raises(DuplicateFlagError) as err:
        normalize_flags(given)
    assert isinstance(err.value, ConfigError)
    first, second = given
    assert first in str(err.value) and second in str(err.value)
    assert "\n" not in str(err.value)


def test_the_new_version_drops_and_adds_flags() -> None:
    old, new = flags_for(), flags_for(NEW)
    for name in GONE_IN_NEW:
        assert name in old and name not in new
        assert canonical_flag(name, NEW) is None
    for name in ADDED_IN_NEW:
        assert name in new and name not in old
    # every option string one version has and the other lacks says what became of it
    old_opts = {o for f in old.values() for o in f.registered}
    new_opts = {o for f in new.values() for o in f.registered}
    assert len(old_opts ^ new_opts) > 250
    assert all(version_hint(o) for o in old_opts ^ new_opts)
    assert new["cuda-graph-bs-decode"].nargs == "+" and new["cuda-graph-bs-decode"].type is int
    assert new["hicache-size"].type is int and new["hicache-size"].default == 0


def test_enable_hicache_is_an_alias_only_in_the_new_version() -> None:
    assert canonical_flag("enable-hicache", NEW) == "enable-hierarchical-cache"
    assert canonical_flag("enable-hicache") is None
    assert normalize_flags({"enable-hicache": True}, NEW) == {"enable-hierarchical-cache": True}
    with pytest.raises(DuplicateFlagError):
        normalize_flags({"enable-hicache": True, "enable-hierarchical-cache": True}, NEW)


def test_unknown_version_is_one_clear_error() -> None:
    for call in (flags_for, defaults, lambda v: canonical_flag("tp", v)):
        with pytest.raises(UnknownVersionError, match=r"unknown SGLang version '0\.4\.0'"):
            call("0.4.0")
    assert issubclass(UnknownVersionError, ConfigError)


def test_defaults_are_what_the_simulators_parser_produces() -> None:
    parser_defaults = {
        a.dest: a.default
        for a in build_parser()._actions
        if a.dest != "help" and not a.dest.startswith("sim_")
    }
    table = flags_for()
    assert {table[n].dest: v for n, v in defaults().items()} == parser_defaults
    d = defaults()
    assert d["tensor-parallel-size"] == 1 and d["hicache-size"] == 0
    assert d["schedule-policy"] == "fcfs" and d["mem-fraction-static"] is None


def test_kv_cache_dtype_choices_are_known_to_the_capacity_calculus() -> None:
    # SGLang 0.5.6.post2 accepts auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1
    assert set(flags_for()["kv-cache-dtype"].choices) <= set(KV_DTYPES)


def test_add_to_parser_behaves_like_sglang_for_the_new_version() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_to_parser(parser, NEW)
    ns = parser.parse_args(
        ["--model", "m", "--tp", "2", "--enable-hicache", "--cuda-graph-bs-decode", "1", "4"]
    )
    assert ns.model_path == "m" and ns.tp_size == 2 and ns.enable_hierarchical_cache is True
    assert ns.cuda_graph_bs_decode == [1, 4]
    assert ns.hicache_host_memory_mode == "cache"
    known = {s for a in parser._actions for s in a.option_strings}
    assert "--cuda-graph-max-bs" not in known and "--stream-output" not in known


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        (
            "cuda-graph-max-bs",
            "SGLang 0.5.23 split it into --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill",
        ),
        (
            "--cuda-graph-bs",
            "SGLang 0.5.23 split it into --cuda-graph-bs-decode and --cuda-graph-bs-prefill",
        ),
        ("stream-output", "gone in SGLang 0.5.23"),
        ("enable-piecewise-cuda-graph", "gone in SGLang 0.5.23"),
        (
            "enable-hicache",
            "new in SGLang 0.5.23; older versions call it --enable-hierarchical-cache",
        ),
        ("hicache-host-memory-fraction", "new in SGLang 0.5.23"),
        ("--hicache-host-memory-mode", "new in SGLang 0.5.23"),
    ],
)
def test_version_hints(flag: str, hint: str) -> None:
    assert version_hint(flag) == hint


def test_no_hint_for_unchanged_flags() -> None:
    assert version_hint("mem-fraction-static") is None
    assert version_hint("cuda-graph") is None  # exact names only, no prefixes


def test_speculation_off_drops_every_speculative_flag() -> None:
    from tuner.sglang.flags import effective_flags

    fixed = {"model-path": "m", "speculative-draft-model-path": "/models/draft"}
    off = effective_flags({**fixed, "speculative-algorithm": "none", "speculative-num-steps": 3})
    assert off == {"model-path": "m"}
    on = effective_flags({**fixed, "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3})
    assert on["speculative-draft-model-path"] == "/models/draft"
    assert on["speculative-algorithm"] == "EAGLE3" and on["speculative-num-steps"] == 3
