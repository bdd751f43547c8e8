"""SGLang's start-up, batch and shutdown log lines per version, against the simulator's.

Facts name `sglang/srt/...` of tag v0.5.6.post2 (OLD) or v0.5.23 (NEW), file:line. The
templates are compared as regular expressions over the simulator's real output.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.helpers.played import NEW, OLD, VERSIONS, played, post
from tuner.sim.loglines import capture_sizes

F = r"[\d.]+"
EXPECTED = {
    OLD: [
        # model_executor/model_runner.py:852-857
        rf"Load weight end\. type=LlamaForCausalLM, dtype=torch\.bfloat16, avail mem={F} GB, mem usage={F} GB\.",
        # mem_cache/memory_pool.py:476-478
        rf"KV Cache is allocated\. #tokens: \d+, K size: {F} GB, V size: {F} GB",
        # model_executor/model_runner.py:2438-2456 (init_device_graphs)
        rf"Capture cuda graph begin\. This can take up to several minutes\. avail mem={F} GB",
        rf"Capture cuda graph end\. Time elapsed: {F} s\. mem usage={F} GB\. avail mem={F} GB\.",
        # managers/scheduler_metrics_mixin.py:139-147 and :270-305
        r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: [\d.]+, "
        r"#running-req: \d+, #queue-req: \d+,$",
        rf"Decode batch, #running-req: \d+, #token: \d+, token usage: {F}, cuda graph: True, "
        rf"gen throughput \(token/s\): {F}, #queue-req: \d+,$",
    ],
    NEW: [
        # model_executor/model_runner.py:1371-1379: elapsed= first, no dtype=
        rf"Load weight end\. elapsed={F} s, type=LlamaForCausalLM, avail mem={F} GB, mem usage={F} GB\.",
        # mem_cache/memory_pool.py:2087-2091: dtype: before #tokens
        rf"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, K size: {F} GB, V size: {F} GB",
        # model_executor/model_runner_components/cuda_graph_setup.py:758-762 and :787-792
        rf"Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, avail mem={F} GB",
        rf"Capture target decode CUDA graph end\. bs=\[1, 2, 4, 8, 12, 16, [\d, ]+\], elapsed={F} s, "
        rf"mem usage={F} GB, avail mem={F} GB\.",
        # managers/scheduler_components/metrics_reporter.py:753-782 (usage text from
        # pool_stats_observer.py:115-117) and :963-1040 (pool_stats_observer.py:145-148)
        r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: [\d.]+, "
        rf"#running-req: \d+, #queue-req: \d+, #pending-token: \d+, cuda graph: False, "
        rf"input throughput \(token/s\): {F}$",
        rf"Decode batch, #running-req: \d+, #token: \d+, token usage: {F}, cuda graph: True, "
        rf"gen throughput \(token/s\): {F}, #queue-req: \d+$",
    ],
}


@pytest.mark.parametrize("version", VERSIONS)
def test_log_lines_of_the_version(version):
    with played(version, "--decode-log-interval", "4") as sim:
        body = {"text": "a b c " * 40, "sampling_params": {"max_new_tokens": 9, "ignore_eos": True}}
        assert post(sim, "/generate", body)[0] == 200
        sim.signal(signal.SIGTERM)
        assert sim.wait(30) == 0
        lines = [re.sub(r"^\[[\d :-]+\] ", "", line) for line in sim.log().splitlines()]
    for pattern in EXPECTED[version]:
        assert any(re.fullmatch(pattern, line) for line in lines), pattern
    # managers/tokenizer_manager.py:1434-1436 (OLD) / :3534-3536 (NEW): the drain line;
    # SGLang has no "Graceful shutdown complete."
    assert (
        "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]."
        in lines
    )
    assert not any("Graceful shutdown complete" in line for line in lines)


def test_capture_sizes_rule():
    # arg_groups/cuda_graph_hook.py:500-531 (NEW): 1, 2, 4, 8, 12, 16..256 step 8,
    # 272..496 step 16, then 512.. step 32, capped at max_bs which is always captured
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 12, 16, 20]
    assert capture_sizes(512)[-4:] == [464, 480, 496, 512]
    assert len(capture_sizes(256)) == 36


@pytest.mark.parametrize("version", VERSIONS)
def test_graph_oom_advice_of_the_version(version):
    # model_executor/cuda_graph_runner.py:899-906 (OLD) names --cuda-graph-max-bs and
    # --disable-cuda-graph; model_executor/runner_backend_utils/__init__.py:14-21 (NEW) names
    # --cuda-graph-max-bs-decode and --cuda-graph-backend-decode=disabled
    from tuner.sim.flags import parse_flags
    from tuner.sim.profile import load_profile
    from tuner.sim.startup import build_script

    ns = parse_flags(
        ["--model-path", "m", "--sim-sglang-version", version, "--mem-fraction-static", "0.982"]
    )
    script = build_script(ns, load_profile(ns.sim_profile))  # llama-3.1-8b-h100: the cliff
    assert script.plan is not None and script.plan.verdict == "graph_oom"
    assert script.failure is not None
    text = "\n".join(line.text for line in script.failure.lines)
    assert "Capture cuda graph failed: CUDA out of memory." in text
    if version == OLD:
        assert "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)" in text
    else:
        assert "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)" in text
        assert "--cuda-graph-backend-decode=disabled" in text
