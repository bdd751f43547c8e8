"""The host's flag set read from argparse help, and names resolved as argparse resolves them."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tuner.check.flagset import flag_problem, help_options, resolve
from tuner.sglang.flags import add_to_parser, flags_for


def help_of(version: str) -> str:
    p = argparse.ArgumentParser(prog="launch_server.py")
    add_to_parser(p, version)
    return p.format_help()


def test_the_simulators_help_lists_every_flag_and_alias() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tuner.sim", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    options = help_options(out.stdout)
    table = {n for f in flags_for().values() for n in (f.name, *f.aliases)}
    assert table <= options  # every SGLang option string, aliases included
    assert {"help", "tp-size", "model", "sim-profile"} <= options


def test_prose_is_not_a_flag() -> None:
    text = (
        "usage: x [-h] [--alpha ALPHA]\n\noptions:\n  -h, --help  show this help\n"
        "  --alpha ALPHA, --a-alias ALPHA\n"
        "                        replaces --old-flag; see\n"
        "                        --another-old for details\n"
    )
    assert help_options(text) == {"help", "alpha", "a-alias"}


@pytest.mark.parametrize(
    ("name", "chosen"),
    [
        ("mem-fraction-static", "mem-fraction-static"),
        ("tp-size", "tp-size"),  # an alias is an option string of its own
        ("tp", "tp-size"),  # a unique prefix, as argparse's allow_abbrev
        ("--enable-metrics", "enable-metrics"),
        ("model", "model"),  # exact wins over being a prefix of --model-path
    ],
)
def test_resolve_selects_as_argparse_does(name: str, chosen: str) -> None:
    assert resolve(name, help_options(help_of("0.5.6.post2")))[0] == chosen


def test_ambiguous_prefix_names_its_candidates_and_what_changed() -> None:
    options = help_options(help_of("0.5.23"))
    assert resolve("cuda-graph-max-bs", options) == (
        None,
        ["cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"],
    )
    problem = flag_problem("cuda-graph-max-bs", options)
    assert problem is not None and "ambiguous" in problem and "split it into" in problem


def test_unknown_flag_gets_did_you_mean_or_its_fate() -> None:
    old, new = help_options(help_of("0.5.6.post2")), help_options(help_of("0.5.23"))
    assert flag_problem("enable-metricz", old) == (
        "the host's SGLang has no such flag; did you mean --enable-metrics?"
    )
    assert flag_problem("stream-output", new) == (
        "the host's SGLang has no such flag (gone in SGLang 0.5.23)"
    )
    problem = flag_problem("enable-hicache", old)  # an older SGLang than the study expects
    assert problem is not None and "new in SGLang 0.5.23" in problem
    assert flag_problem("enable-hicache", new) is None
