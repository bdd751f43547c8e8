"""`/server_info`'s keys that SGLang 0.5.23 adds, against the simulator over HTTP (both versions).

Facts name `sglang/srt/...` of v0.5.23 (NEW) or v0.5.6.post2 (OLD), file:line. HS is
`entrypoints/http_server.py`, CORE `sampling/watermarking/core.py`, ST
`observability/startup_time.py`.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.played import NEW, OLD, get, played
from tests.helpers.simproc import FAST_STARTUP, SimProc, sim_server
from tuner.sim.flags import parse_flags
from tuner.sim.profile import load_profile
from tuner.sim.startup import build_script, engine_startup_time

#: ST:20-27 and :62-68: the engine's startup_time, in this order
STARTUP_KEYS = [
    "load_weight",
    "kv_cache_allocation",
    "scheduler_e2e",
    "cuda_graph",
    "tokenizer_e2e",
]
#: model_executor/graph_memory_usage.py:5-16: every phase, 0.0 where nothing was captured
GRAPH_PHASES = [
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
]
NEW_KEYS = ("launch_command", "startup_time", "frontend")
KIMI_EAGLE3 = (
    *("--sim-profile", "kimi-k2.5-tp8", "--tp-size", "8", "--mem-fraction-static", "0.85"),
    *("--speculative-algorithm", "EAGLE3"),
    *("--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3"),
    *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
    *("--speculative-num-draft-tokens", "4"),
)


def info(sim: SimProc, path: str = "/server_info", key: str | None = None) -> dict:
    req = urllib.request.Request(sim.url + path)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def elapsed(log: str, pattern: str) -> float:
    """The `elapsed=X s` of the start-up line that matches `pattern`."""
    m = re.search(pattern + r".*?elapsed=([\d.]+) s", log)
    assert m, pattern
    return float(m.group(1))


def check_startup_time(got: object) -> dict:
    """ST's shape: five keys, floats; cuda_graph every phase of graph_memory_usage.py."""
    assert isinstance(got, dict) and list(got) == STARTUP_KEYS
    assert list(got["cuda_graph"]) == GRAPH_PHASES
    values = [got[k] for k in STARTUP_KEYS if k != "cuda_graph"] + list(got["cuda_graph"].values())
    assert all(isinstance(v, float) and v >= 0 for v in values), got
    # the scheduler's init holds its weights, pool and graphs (managers/scheduler.py:745-758:
    # scheduler_e2e from its start to its end); the launch waited for it (engine.py:1100-1112)
    parts = got["load_weight"] + got["kv_cache_allocation"] + sum(got["cuda_graph"].values())
    assert parts <= got["scheduler_e2e"] <= got["tokenizer_e2e"]
    return got


def test_new_keys_of_0_5_23_and_not_of_0_5_6(sim):
    body = info(sim)
    keys = [k for k in body if k != "simulator"]  # the simulator's own, last
    if sim.version == OLD:
        # OLD HS:544-561: {**asdict(server_args), **scheduler_info, internal_states, version}
        assert not set(NEW_KEYS) & set(body)
        assert keys[-5:] == [
            "status",
            "max_total_num_tokens",
            "max_req_input_len",
            "internal_states",
            "version",
        ]
        assert not set(NEW_KEYS) & set(info(sim, "/get_server_info"))
        return
    # NEW HS:881-891 over utils/common.py:3584-3593: resolved_dict(), then launch_command, the
    # scheduler's info (its startup_time replaced by the tokenizer manager's, the key keeps its
    # place), then internal_states, version, frontend
    tail = ["launch_command", "status", "max_total_num_tokens", "max_req_input_len"]
    assert keys[-8:] == [*tail, "startup_time", "internal_states", "version", "frontend"]
    # HS:889: "frontend": "python", a constant of the Python server
    assert body["frontend"] == "python"
    # server_args.py:302-305 and :714-719: a str, argv after the program (sys.argv[1:],
    # launch_server.py:80) joined by spaces (CORE:134); tests/helpers add the model path first
    # and the port and start-up time last
    command = body["launch_command"]
    assert isinstance(command, str)
    assert command.startswith("--model-path sim/model --sim-sglang-version 0.5.23 ")
    assert command.endswith(f" --port {sim.port} --sim-startup-seconds {FAST_STARTUP}")
    assert "--served-model-name sim-llama --enable-metrics --enable-cache-report" in command
    # HS:886 the tokenizer manager's startup_time (set at HS:284, managers/
    # tokenizer_manager.py:862-865), ST:62-68's shape; the simulator's virtual times agree
    # with its own log lines (model_runner.py:1366-1379, cuda_graph_setup.py:784-793)
    got = check_startup_time(body["startup_time"])
    log = sim.log()
    assert round(got["load_weight"], 2) == elapsed(log, "Load weight end")
    # cuda_graph_setup.py:705-710: a target without speculation captures "decode"
    assert round(got["cuda_graph"]["decode"], 2) == elapsed(log, "Capture target decode")
    assert got["cuda_graph"]["target_verify"] == got["cuda_graph"]["draft_decode"] == 0.0
    # HS:853-860: the old name answers the same (the times are fixed at start-up)
    old = info(sim, "/get_server_info")
    assert {k: old[k] for k in NEW_KEYS} == {k: body[k] for k in NEW_KEYS}


def test_launch_command_merges_the_config_and_hides_secrets(tmp_path: Path):
    config = tmp_path / "launch.yaml"
    config.write_text("model-path: sim/model\napi-key: sk-from-config-1234\n")
    watermark = '{"key": "wm-secret"}'
    flags = (
        *("--served-model-name", "sim-llama", "--config", str(config)),
        *("--admin-api-key=adm-secret-5678", "--watermark-config", watermark),
    )
    with played(NEW, *flags) as sim:
        body = info(sim, key="sk-from-config-1234")
        log = sim.log()
    command = body["launch_command"]
    # server_args.py:683-689 with utils/server_args_config_parser.py:99-106: the file's flags
    # first, then the command line around `--config FILE` (which is gone)
    assert command.startswith("--model-path sim/model --api-key <redacted> ")
    assert "--config" not in command and str(config) not in command
    # CORE:110-134: the value after `--watermark-config` is "<redacted>", as is `--flag=value`
    # when it holds the watermark config; the simulator applies the same rule to --api-key,
    # --admin-api-key and --ssl-keyfile-password, which SGLang shows as given
    assert "--watermark-config <redacted>" in command and "wm-secret" not in command
    assert "--admin-api-key=<redacted>" in command and "adm-secret" not in command
    assert "sk-from-config" not in command
    # CORE:25-27 and :80-91 (HS:883): those keys become "<redacted>" wherever they are, None
    # or not
    assert body["watermark_config"] == body["watermark_key"] == body["watermark_key_b"]
    assert body["watermark_key"] == "<redacted>"
    # arg_groups/fields/serving.py:160-167 and server_args.py:326-333: api_key and
    # admin_api_key are fields, reported as given by resolved_dict (behind the key itself)
    assert body["api_key"] == "sk-from-config-1234"
    assert body["admin_api_key"] == "adm-secret-5678"
    assert "sk-from-config-1234" in log  # and in the server_args= line, as SGLang logs it


def test_startup_time_under_speculation():
    with sim_server("--sim-sglang-version", NEW, *KIMI_EAGLE3) as sim:
        got = check_startup_time(info(sim)["startup_time"])
        log = sim.log()
    graphs = got["cuda_graph"]
    # cuda_graph_setup.py:705-710: the target captures "target_verify", the draft
    # "draft_decode"; speculative/base_spec_worker.py:88-93 adds its "draft_extend"
    assert graphs["decode"] == 0.0 and graphs["target_verify"] > 0.0
    assert graphs["draft_decode"] > 0.0 and graphs["draft_extend"] > 0.0
    assert graphs["prefill"] == graphs["draft_prefill"] == 0.0
    # ST:20-21 (managers/scheduler.py:746-750): load_weight is the target's plus the draft's
    assert got["load_weight"] > elapsed(log, "Load weight end")


@pytest.mark.parametrize("flag", ["--disable-cuda-graph", "--cuda-graph-backend-decode=disabled"])
def test_no_graphs_no_capture_time(flag):
    # cuda_graph_setup.py:731-734: a disabled decode backend captures nothing (capture_time 0)
    ns = parse_flags(["--model-path", "m", "--sim-sglang-version", NEW, flag])
    profile = load_profile(ns.sim_profile)
    got = check_startup_time(engine_startup_time(ns, profile, build_script(ns, profile)))
    assert set(got["cuda_graph"].values()) == {0.0}


def test_server_info_of_the_played_version_only():
    # OLD HS:544-561 has no launch_command, startup_time nor frontend, whatever the flags
    with played(OLD, "--api-key", "k-old-1234") as sim:
        assert (
            get(sim, "/server_info")[0] == 401
        )  # OLD utils/common.py:1134-1146: all but /health, /metrics
        body = info(sim, "/get_server_info", key="k-old-1234")
    assert not set(NEW_KEYS) & set(body) and body["version"] == OLD
