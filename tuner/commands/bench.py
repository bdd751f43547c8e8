"""`tuner bench`: one load run against any running SGLang-compatible server.

Prints a bench_serving-like summary; `--json FILE` writes bench_serving's result keys plus the
tuner's additions (p90s, errors, the server's own view from /metrics, the client self-check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, HostUnreachable
from tuner.workload import BACKENDS, WORKLOAD_KINDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="one load run against a running server")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", type=int, required=True, help="closed-loop concurrency")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, help="stop after S seconds (cancels in-flight)")
    bound.add_argument("--num-requests", type=int, help="send N requests (default 1000)")
    p.add_argument("--backend", choices=BACKENDS, default="sglang")
    p.add_argument("--workload", choices=WORKLOAD_KINDS, default="random")
    p.add_argument("--dataset", help="ShareGPT JSON/JSONL or prompts JSONL file")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*r, L]")
    p.add_argument("--num-groups", type=int, default=64)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--question-len", type=int, default=128)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson rate (req/s)")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before the run")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the key")
    p.add_argument("--model", help="model name for OpenAI endpoints (default: /v1/models)")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def _specs(args: argparse.Namespace) -> tuple[Any, Any]:
    """Command-line values -> (WorkloadSpec, LoadOptions); bad values raise ConfigError."""
    if not args.url.startswith(("http://", "https://")):
        raise ConfigError(f"{args.url!r} is not an http(s) URL", key="--url")
    if args.workload in ("sharegpt", "jsonl") and not args.dataset:
        raise ConfigError(f"--workload {args.workload} needs --dataset FILE", key="--dataset")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(
                f"environment variable {args.api_key_env} is not set", key="--api-key-env"
            )
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ConfigError(f"directory of {args.json} does not exist", key="--json")
    try:
        return _build(args, api_key)
    except ConfigError as exc:
        # name the command-line flag, not the study-file key the dataclasses use
        field = (exc.key or "").rsplit(".", 1)[-1]
        flag = _FLAG_OF.get(field, "--" + field.replace("_", "-"))
        raise ConfigError(exc.detail, key=flag) from None


_FLAG_OF = {
    "kind": "--workload",
    "dataset_path": "--dataset",
    "duration_s": "--duration",
    "request_timeout_s": "--request-timeout",
}


def _build(args: argparse.Namespace, api_key: str | None) -> tuple[Any, Any]:
    from tuner.loadgen import LoadOptions
    from tuner.workload import WorkloadSpec

    n = args.num_requests
    if n is None:
        # a duration-bounded run needs enough requests to stay busy for the whole window
        n = max(1000, 20 * args.concurrency) if args.duration else 1000
    spec = WorkloadSpec(
        kind=args.workload,
        num_requests=n,
        seed=args.seed,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        num_groups=args.num_groups,
        prompts_per_group=args.prompts_per_group,
        prefix_len=args.prefix_len,
        question_len=args.question_len,
        turns=args.turns,
        dataset_path=args.dataset,
    )
    options = LoadOptions(
        backend=args.backend,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        duration_s=args.duration,
        num_requests=args.num_requests,
        warmup_requests=args.warmup_requests,
        flush_cache=args.flush_cache,
        request_timeout_s=args.request_timeout,
        stream=not args.no_stream,
        seed=args.seed,
        model=args.model,
        api_key=api_key,
    )
    return spec, options


def run(args: argparse.Namespace) -> int:
    from tuner.loadgen import run_load_sync
    from tuner.workload import build_requests

    spec, options = _specs(args)
    requests = build_requests(spec)
    if args.no_progress:
        result = run_load_sync(args.url, requests, options)
    else:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as progress:
            result = run_load_sync(args.url, requests, options, progress)
    m = result.metrics()
    if m.completed == 0 and m.errors and set(m.error_kinds) == {"connection"}:
        raise HostUnreachable(f"cannot reach {args.url}: every request failed to connect")
    out: dict[str, Any] = {
        "backend": options.backend,
        "workload": spec.kind,
        "max_concurrency": options.concurrency,
        "request_rate": None if math.isinf(options.request_rate) else options.request_rate,
        **result.summary(),
    }
    _print_summary(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _print_summary(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Serving Benchmark Result", show_header=False, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")

    def row(label: str, key: str, fmt: str = "{:.2f}") -> None:
        value = out.get(key)
        t.add_row(label, "-" if value is None else fmt.format(value))

    t.add_row("Backend", str(out["backend"]))
    t.add_row("Workload", str(out["workload"]))
    row("Max request concurrency", "max_concurrency", "{}")
    row("Request rate (req/s)", "request_rate")
    row("Successful requests", "completed", "{}")
    row("Failed requests", "errors", "{}")
    row("Cancelled at stop", "cancelled", "{}")
    row("Benchmark duration (s)", "duration")
    row("Total input tokens", "total_input_tokens", "{}")
    row("Total generated tokens", "total_output_tokens", "{}")
    row("Request throughput (req/s)", "request_throughput")
    row("Input token throughput (tok/s)", "input_throughput")
    row("Output token throughput (tok/s)", "output_throughput")
    row("Total token throughput (tok/s)", "total_throughput")
    row("Concurrency", "concurrency")
    if out.get("cancelled"):
        row("Tokens of cut requests", "cut_output_tokens", "{}")
        row("Window output throughput (tok/s)", "window_output_throughput")
    for title, key in (
        ("E2E latency", "e2e_latency"),
        ("TTFT", "ttft"),
        ("TPOT", "tpot"),
        ("ITL", "itl"),
    ):
        t.add_section()
        for stat in ("mean", "median", "p90", "p99"):
            row(f"{stat.capitalize()} {title} (ms)", f"{stat}_{key}_ms")
    row("P95 ITL (ms)", "p95_itl_ms")
    row("Max ITL (ms)", "max_itl_ms")
    server = out.get("server")
    if server:
        t.add_section()
        for label, key, fmt in (
            ("Server: generated tokens", "generation_tokens", "{:.0f}"),
            ("Server: output throughput (tok/s)", "output_throughput", "{:.2f}"),
            ("Server: cache hit rate", "cache_hit_rate", "{:.1%}"),
            ("Server: mean running requests", "mean_running_reqs", "{:.1f}"),
            ("Server: mean queued requests", "mean_queue_reqs", "{:.1f}"),
            ("Server: mean token usage", "mean_token_usage", "{:.2f}"),
        ):
            if server.get(key) is not None:
                t.add_row(label, fmt.format(server[key]))
    t.add_section()
    check = out["self_check"]
    t.add_row("Client self-check", "ok" if check["ok"] else "; ".join(check["reasons"]))
    t.add_row("Stopped by", str(out["stopped"]))
    Console().print(t)
