"""DP attention and speculative decoding on the real simulator (HTTP, logs, exit codes), per
version, against SGLang's source.

Facts name `sglang/srt/...` of v0.5.6.post2 (OLD) or v0.5.23 (NEW), file:line. The simulator
plays the Kimi-K2.5 TP8 profile (its EAGLE-3 draft and DP attention's costs).
"""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.played import NEW, OLD, VERSIONS, get
from tests.helpers.simproc import SimProc, sim_server

KIMI = ("--sim-profile", "kimi-k2.5-tp8", "--tp-size", "8")
EAGLE3 = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "AQ-MedAI/Kimi-K25-eagle3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
#: DP attention 8 on Kimi: the replicated attention weights need mfs above ~0.86 and DP's
#: graph buffers a small graph batch (see tests/unit/sim/test_sim_levers.py)
DP8 = ("--enable-dp-attention", "--dp-size", "8", "--mem-fraction-static", "0.92")


def graph_bs(version: str, bs: int) -> tuple[str, str]:
    """The decode graph batch flag of the version (0.5.23 split it)."""
    return ("--cuda-graph-max-bs" if version == OLD else "--cuda-graph-max-bs-decode", str(bs))


def info(sim: SimProc) -> dict:
    status, text = get(sim, "/get_server_info")
    assert status == 200, text
    return json.loads(text)


def load(sim: SimProc, n: int = 16, tokens: int = 60) -> None:
    """`n` concurrent requests of `tokens` output tokens."""

    def one(_: int) -> int:
        body = {
            "text": "w1 w2 w3 " * 40,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
        req = urllib.request.Request(
            sim.url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())["meta_info"]["completion_tokens"]

    with ThreadPoolExecutor(n) as pool:
        assert list(pool.map(one, range(n))) == [tokens] * n


def refused(*flags: str) -> tuple[int, str]:
    """Start a simulator that must exit: (exit code, its log)."""
    proc = SimProc.start([*KIMI, *flags])
    try:
        return proc.wait(30), proc.log()
    finally:
        proc.kill()


@pytest.mark.parametrize("version", VERSIONS)
def test_refusals_end_the_launch_with_sglangs_message(version):
    """ServerArgs' post-init raises in the launch process: a traceback ending in SGLang's
    message, exit 1, before any model loading (OLD server_args.py:1733-1737, :1863-1867;
    NEW arg_groups/speculative_hook.py:1078-1084, :1365-1371)."""
    v = ("--sim-sglang-version", version)
    code, log = refused(*v, *DP8, "--speculative-algorithm", "STANDALONE")
    assert code == 1
    assert "Traceback (most recent call last):" in log
    assert (
        "ValueError: Currently standalone speculative decoding does not support dp attention."
        in log
    )
    assert "server_args=ServerArgs" not in log and "Load weight" not in log
    code, log = refused(*v, *DP8, "--speculative-algorithm", "NGRAM")
    assert code == 1
    assert "ValueError: Currently ngram speculative decoding does not support dp attention." in log
    # OLD server_args.py:1570, NEW parallel_hook.py:326: tp must be a multiple of dp
    code, log = refused(*v, "--enable-dp-attention", "--dp-size", "3")
    assert code == 1 and re.search(r"^AssertionError$", log, re.M)


def test_new_refusals_of_its_own():
    """NEW: an unknown algorithm (speculative/spec_info.py:50-65; OLD's argparse choices refuse
    it, exit 2) and replicas beside attention DP (arg_groups/parallel_hook.py:287-292)."""
    code, log = refused("--sim-sglang-version", NEW, "--speculative-algorithm", "medusa")
    assert code == 1 and "ValueError: Unknown speculative algorithm name: MEDUSA" in log
    code, log = refused("--speculative-algorithm", "MEDUSA")
    assert code == 2 and "invalid choice: 'MEDUSA'" in log
    code, log = refused("--sim-sglang-version", NEW, "--attn-dp-size", "4", "--dp-size", "2")
    assert code == 1 and (
        "--dp-size 2 with --attn-dp-size 4: data-parallel replicas combined with attention data "
        "parallelism are not supported." in log
    )


def test_a_draft_the_profile_lacks_is_refused_like_a_bad_value():
    """The simulator cannot play NGRAM or a draft its profile has no `speculative:` for: argparse's
    form, exit 2, so a study learns it at once rather than calling it a crash."""
    code, log = refused("--speculative-algorithm", "NGRAM")
    assert code == 2
    assert (
        "argument --speculative-algorithm: NGRAM is not simulated on profile kimi-k2.5-tp8" in log
    )
    code, log = refused(*EAGLE3[:2])  # EAGLE3 without a draft path on a model that is not MTP
    assert code == 2 and "needs --speculative-draft-model-path" in log


ACCEPT = {
    # OLD managers/scheduler_metrics_mixin.py:270-305: accept len and rate (accepted tokens,
    # bonus included, over draft tokens) after the token usage; a trailing comma
    OLD: r"Decode batch, #running-req: \d+, #token: \d+, token usage: [\d.]+, accept len: "
    r"(?P<len>[\d.]+), accept rate: (?P<rate>[\d.]+), cuda graph: (True|False), "
    r"gen throughput \(token/s\): [\d.]+, #queue-req: \d+,$",
    # NEW managers/scheduler_components/metrics_reporter.py:963-1042: the same place, the rate
    # of drafts (correct drafts over draft tokens - 1), no trailing comma
    NEW: r"Decode batch, #running-req: \d+, #token: \d+, token usage: [\d.]+, accept len: "
    r"(?P<len>[\d.]+), accept rate: (?P<rate>[\d.]+), cuda graph: (True|False), "
    r"gen throughput \(token/s\): [\d.]+, #queue-req: \d+$",
}


@pytest.mark.parametrize("version", VERSIONS)
def test_speculation_defaults_accept_length_and_metrics(version):
    with sim_server(
        *KIMI,
        "--sim-sglang-version",
        version,
        "--mem-fraction-static",
        "0.85",
        "--enable-metrics",
        "--decode-log-interval",
        "4",
        *EAGLE3,
    ) as sim:
        load(sim)
        got = info(sim)
        # OLD server_args.py:1739-1743, NEW speculative_hook.py:1086-1095: 48 when unset
        assert got["max_running_requests"] == 48
        assert got["speculative_algorithm"] == "EAGLE3"
        assert got["speculative_num_draft_tokens"] == 4
        # OLD server_args.py:1754-1758: the overlap scheduler off; NEW keeps it (spec v2)
        assert got["disable_overlap_schedule"] is (version == OLD)
        state = got["internal_states"][0]
        assert state["max_running_requests"] == 48
        # OLD managers/scheduler.py:2288-2291: the mean accept length once a log line counted
        assert 1.0 < state["avg_spec_accept_length"] <= 4.0
        status, metrics = get(sim, "/metrics")
        # OLD metrics/collector.py:306-318, NEW observability/metrics_collector.py:511-522
        gauge = re.search(r"^sglang:spec_accept_length\{[^}]*\} ([\d.]+)$", metrics, re.M)
        assert status == 200 and gauge and 1.0 < float(gauge.group(1)) <= 4.0
        sim.signal(signal.SIGTERM)
        assert sim.wait(30) == 0
        log = sim.log()
    lines = [re.sub(r"^\[[\d :-]+ TP0\] ", "", ln) for ln in log.splitlines()]
    decode = [re.match(ACCEPT[version], ln) for ln in lines if ln.startswith("Decode batch")]
    assert decode and all(decode), [ln for ln in lines if ln.startswith("Decode batch")][:2]
    for m in decode:
        length, rate = float(m["len"]), float(m["rate"])
        assert 1.0 <= length <= 4.0
        # the two versions define the rate differently (ACCEPT's comments)
        expected = length / 4 if version == OLD else (length - 1) / 3
        # both are printed to 2 decimals: the rate's rounding (0.005) plus the length's carried
        # through (0.005 / 3 for NEW: 2.875 prints 2.88 and its rate 0.625 prints 0.62)
        assert rate == pytest.approx(expected, abs=0.005 + 0.005 / 3 + 1e-9)
    # the post-init warnings come before the server_args line, unprefixed (logging is not yet
    # configured when ServerArgs' __post_init__ runs: OLD launch_server.py:24)
    reset = lines.index(
        "Max running requests is reset to 48 for speculative decoding. You can override this "
        "by explicitly setting --max-running-requests."
    )
    assert reset < next(i for i, ln in enumerate(lines) if "server_args=ServerArgs" in ln)


@pytest.mark.parametrize("version", VERSIONS)
def test_dp_attention_groups_report_and_log_on_their_own(version):
    flags = (*KIMI, "--sim-sglang-version", version, *DP8, *graph_bs(version, 64))
    flags += ("--enable-metrics", "--decode-log-interval", "4", "--max-running-requests", "64")
    with sim_server(*flags) as sim:
        load(sim, n=24, tokens=40)
        got = info(sim)
        states = got["internal_states"]
        # one internal state per DP group (the tokenizer manager gathers each DP rank's),
        # each with the flag // dp (OLD managers/tp_worker.py:292-300)
        assert len(states) == 8
        assert {s["max_running_requests"] for s in states} == {8}
        # OLD server_args.py:1568-1574, NEW arg_groups/parallel_hook.py:316-339
        assert got["chunked_prefill_size"] == 8192 // 8
        assert got["schedule_conservativeness"] == pytest.approx(0.3)
        assert got["enable_dp_attention"] is True
        if version == NEW:  # parallel_hook.py:40-63 and server_args.py:331-332
            assert (got["dp_size"], got["attn_dp_size"]) == (1, 8)
        else:
            assert got["dp_size"] == 8
        _, metrics = get(sim, "/metrics")
        # every DP rank's scheduler reports with its tp_rank and dp_rank (OLD
        # managers/scheduler_metrics_mixin.py:63-71, NEW observability/metrics_collector.py:
        # 1384-1392)
        ranks = re.findall(
            r'^sglang:num_running_reqs\{[^}]*tp_rank="(\d)"[^}]*dp_rank="(\d)"', metrics, re.M
        )
        assert sorted(ranks) == [(str(g), str(g)) for g in range(8)]
        log = sim.log()
    # each group logs with its DP rank and its first GPU's TP rank (OLD managers/scheduler.py:
    # 2635-2645, NEW :6279-6290), round robin sending them requests alike
    groups = set(re.findall(r"^\[[\d :-]+ DP(\d) TP(\d)\] Decode batch", log, re.M))
    assert groups == {(str(g), str(g)) for g in range(8)}
    assert re.search(r"^\[[\d :-]+ DP0 TP0\] Load weight end", log, re.M)
    warning = {
        OLD: "DP attention is enabled. The chunked prefill size is adjusted to 1024 to avoid "
        "MoE kernel issues. ",
        NEW: "DP attention is enabled. chunked prefill size is adjusted from 8192 to 1024.",
    }[version]
    assert warning in log.splitlines()
