"""bench_serving's names for what tuner sends: backends, datasets, the keys a result carries. Pure.

People who know `python -m sglang.bench_serving` read a trial's `metrics.json` and type
`tuner bench` flags in its words (sglang-reference.md section 7). tuner's own workload kinds
map onto its datasets: `random` is `random` with the same lengths rule (its prompts are
synthetic token ids on SGLang's native API, as bench_serving's `random-ids`, which tuner also
accepts; bench_serving's `random` decodes ids through a tokenizer, which tuner does not load),
`shared-prefix` is `generated-shared-prefix`, `sharegpt` reads a local file (bench_serving
downloads one when no path is given). `multi-turn` and `jsonl` have no bench_serving name and
keep tuner's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tuner.config.workload import WorkloadSection

#: tuner's backend -> bench_serving's name for the same endpoint
BACKEND_NAME = {"sglang": "sglang", "openai": "sglang-oai", "openai-chat": "sglang-oai-chat"}
#: bench_serving's backends tuner speaks -> tuner's (the same HTTP API under another name)
BACKEND_ALIASES = {
    "sglang-native": "sglang",
    "sglang-oai": "openai",
    "vllm": "openai",
    "lmdeploy": "openai",
    "sglang-oai-chat": "openai-chat",
    "vllm-chat": "openai-chat",
    "lmdeploy-chat": "openai-chat",
}
#: tuner's workload kind -> bench_serving's --dataset-name
DATASET_NAME = {
    "random": "random",
    "shared-prefix": "generated-shared-prefix",
    "sharegpt": "sharegpt",
}
#: bench_serving's --dataset-name -> tuner's workload kind
DATASET_KINDS = {
    "random": "random",
    "random-ids": "random",
    "generated-shared-prefix": "shared-prefix",
    "sharegpt": "sharegpt",
}


def backend_kind(name: str) -> str | None:
    """tuner's backend for a tuner or bench_serving backend name; None: not one tuner speaks."""
    if name in BACKEND_NAME:
        return name
    return BACKEND_ALIASES.get(name)


def run_keys(w: WorkloadSection, concurrency: int, request_rate: float | None) -> dict[str, Any]:
    """bench_serving's identifying keys of one run (the "Arguments" half of its result line).

    `request_rate` None (or inf) is a closed loop; JSON has no inf, so it is written as null.
    """
    rate = None if request_rate is None or math.isinf(request_rate) else request_rate
    return {
        "backend": BACKEND_NAME.get(w.backend, w.backend),
        "dataset_name": DATASET_NAME.get(w.kind, w.kind),
        "request_rate": rate,
        "max_concurrency": concurrency,
        "sharegpt_output_len": w.dataset_output_len if w.kind == "sharegpt" else None,
        "random_input_len": w.input_len,
        "random_output_len": w.output_len,
        "random_range_ratio": w.range_ratio,
    }


def trial_run_keys(w: WorkloadSection, client: Mapping[str, Any]) -> dict[str, Any]:
    """`run_keys` of a study's trial from its client-side params (`concurrency`,
    `request-rate`; unset: concurrency 1, as the study's load run, and the workload's rate)."""
    rate = client.get("request-rate", w.request_rate)
    return run_keys(w, int(client.get("concurrency", 1)), None if rate is None else float(rate))
