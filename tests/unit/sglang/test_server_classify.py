"""Failure classes from SGLang's real start-up and runtime messages (reference section 6)."""

from __future__ import annotations

import pytest

from tuner.server.info import mismatches, values_match
from tuner.sglang.failures import FailureClass, explain_failure

P = "[2026-01-12 10:00:00 TP0] "
SIGQUIT = "[2026-01-12 10:00:01] Received sigquit from a child process. It usually means the child failed."


def crash(*lines: str) -> list[str]:
    """A scheduler exception as SGLang's parent shows it before SIGKILLing its tree."""
    return [
        P
        + "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.2 GB, mem usage=15.1 GB.",
        P + "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2580, in run_scheduler_process',
        *lines,
        SIGQUIT,
    ]


CASES = [
    (
        "oom_cuda_graph",
        137,
        [
            P + "KV Cache is allocated. #tokens: 450000, K size: 27.47 GB, V size: 27.47 GB",
            *crash(
                "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
                "GPU 0 has a total capacity of 79.10 GiB of which 1.05 GiB is free.",
                "Possible solutions:",
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
                "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
            ),
        ],
    ),
    (
        "oom_runtime",
        137,
        crash("RuntimeError: Prefill out of memory. Try to lower your batch size."),
    ),
    (
        "not_enough_memory",
        137,
        crash(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.3"
        ),
    ),
    (
        "host_memory",
        137,
        crash(
            "ValueError: Not enough host memory available. Requesting 600.00 GB but only have "
            "490.21 GB free. Please reduce the size of the hierarchical cache."
        ),
    ),
    (
        "host_memory",
        137,
        crash(
            "AssertionError: The host memory should be larger than the device memory with the "
            "current protocol"
        ),
    ),
    (
        "bad_flag",
        2,
        [
            "usage: launch_server.py [-h] --model-path MODEL_PATH",
            "launch_server.py: error: unrecognized arguments: --mem-fraction 0.8",
        ],
    ),
    (
        "bad_flag",
        2,
        [
            "usage: launch_server.py [-h] --model-path MODEL_PATH",
            "launch_server.py: error: argument --hicache-size: invalid int value: '1.5'",
        ],
    ),
    (
        "port_in_use",
        1,
        [
            P + "The server is fired up and ready to roll!",
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
            "address already in use",
        ],
    ),
    ("crashed", 137, crash("KeyError: 'model.layers.0.mlp.gate_proj.weight'")),
    (
        "bad_flag",
        1,
        [
            "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are "
            "mutually exclusive and cannot be used at the same time. Please use only one of them."
        ],
    ),
    ("crashed", None, []),
]


@pytest.mark.parametrize(
    ("expected", "code", "tail"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_classifies_sglang_messages(expected: str, code: int | None, tail: list[str]) -> None:
    assert expected in list(FailureClass)
    assert explain_failure(code, tail)[0] == expected
    cls, reason = explain_failure(code, tail)
    assert cls == expected
    assert "\n" not in reason
    if tail:
        assert reason  # the evidence line, never empty when there was a log


def test_reason_is_the_telling_line() -> None:
    _, reason = explain_failure(137, CASES[0][2])
    assert reason.startswith("Exception: Capture cuda graph failed")


def test_bare_cuda_oom_is_placed_by_start_up_phase() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
    assert (
        explain_failure(137, ["Loading safetensors checkpoint shards", oom])[0]
        == "not_enough_memory"
    )
    weights = P + "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=64.15 GB"
    assert explain_failure(137, [weights, oom])[0] == "oom_cuda_graph"  # the KV pool did not fit
    kv = P + "KV Cache is allocated. #tokens: 450000, K size: 27.47 GB, V size: 27.47 GB"
    assert explain_failure(137, [kv, oom])[0] == "oom_cuda_graph"
    ready = P + "The server is fired up and ready to roll!"
    assert explain_failure(137, [kv, ready, oom])[0] == "oom_runtime"


def test_crash_reason_names_the_exit_code_and_last_line() -> None:
    cls, reason = explain_failure(1, ["something", "ImportError: no module named flashinfer"])
    assert cls == "crashed"
    assert reason == "exit code 1: ImportError: no module named flashinfer"


def test_values_match_numbers_with_tolerance_and_types() -> None:
    assert values_match(0.85, 0.8500000001)
    assert not values_match(0.85, 0.84)
    assert values_match("0.85", 0.85)  # YAML strings against JSON numbers
    assert values_match(8192, 8192)
    assert values_match(True, True) and not values_match(True, False)
    assert values_match(False, None)
    assert values_match("lpm", "lpm") and not values_match("lpm", "fcfs")
    assert values_match([1, 2], [1, 2]) and not values_match([1, 2], [1, 3])


def test_mismatches_compare_dashed_flags_with_underscored_args() -> None:
    info = {"mem_fraction_static": 0.8, "schedule_policy": "lpm", "chunked_prefill_size": 4096}
    flags = {"mem-fraction-static": 0.85, "schedule-policy": "lpm", "hicache-size": 10}
    assert mismatches(flags, info) == ["mem-fraction-static: asked 0.85, server has 0.8"]
