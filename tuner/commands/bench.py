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
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError

from tuner.commands.common import output_file
from tuner.config import MAX_CONCURRENCY, WorkloadSection
from tuner.errors import ConfigError, HostUnreachable

if TYPE_CHECKING:
    from tuner.loadgen import LoadOptions
    from tuner.workload import Request

#: bench_serving's --num-prompts default, when neither a count nor a duration is given
_DEFAULT_NUM_REQUESTS = 1000

#: WorkloadSection key -> the flag that sets it (others: `--` + the key with dashes)
_FLAG_OF = {
    "kind": "--workload",
    "dataset": "--dataset",
    "duration_s": "--duration",
    "request_timeout_s": "--request-timeout",
    "stream": "--no-stream",
}

#: flags whose value is a WorkloadSection key of the same name (unset: the section's default)
_SAME_NAME = (
    "backend",
    "input_len",
    "output_len",
    "range_ratio",
    "num_groups",
    "prompts_per_group",
    "prefix_len",
    "question_len",
    "turns",
    "warmup_requests",
    "seed",
    "model",
)


def _choices(key: str) -> tuple[str, ...]:
    return get_args(WorkloadSection.model_fields[key].annotation)


def _default(key: str) -> str:
    return f"(default {WorkloadSection.model_fields[key].default})"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="one load run against a running server")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", type=int, required=True, help="closed-loop concurrency")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, help="stop after S seconds (cancels in-flight)")
    bound.add_argument(
        "--num-requests", type=int, help=f"send N requests (default {_DEFAULT_NUM_REQUESTS})"
    )
    # an unset flag takes the study file's default (config.WorkloadSection); the defaults
    # given here are where bench_serving's conventions differ from a study's
    p.add_argument("--backend", choices=_choices("backend"), help=_default("backend"))
    p.add_argument("--workload", choices=_choices("kind"), help=_default("kind"))
    p.add_argument("--dataset", help="ShareGPT JSON/JSONL or prompts JSONL file")
    for key in ("input_len", "output_len"):
        p.add_argument("--" + key.replace("_", "-"), type=int, help=_default(key))
    # bench_serving's random lengths go down to 1 (a study's are exact by default)
    p.add_argument(
        "--range-ratio", type=float, default=0.0, help="lengths uniform in [L*r, L] (default 0)"
    )
    for key in ("num_groups", "prompts_per_group", "prefix_len", "question_len", "turns"):
        p.add_argument("--" + key.replace("_", "-"), type=int, help=_default(key))
    p.add_argument("--request-rate", type=float, help="Poisson rate (req/s); default closed loop")
    p.add_argument("--warmup-requests", type=int, help=_default("warmup_requests"))
    # bench_serving flushes only when asked (a study flushes before every run by default)
    p.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before the run")
    p.add_argument(
        "--request-timeout", type=float, help="seconds per request " + _default("request_timeout_s")
    )
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the key")
    p.add_argument("--model", help="model name for OpenAI endpoints (default: /v1/models)")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--seed", type=int, help=_default("seed"))
    p.add_argument("--json", metavar="FILE", type=output_file, help="write the results as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def _plan(args: argparse.Namespace) -> tuple[WorkloadSection, list[Request], LoadOptions]:
    """Command-line values -> (workload, requests, options); bad values raise ConfigError."""
    from tuner.loadgen import load_options
    from tuner.workload import requests_for

    _check_url(args.url)
    if args.concurrency < 1:
        # not a workload key: in a study, concurrency is a searched parameter
        raise ConfigError(f"must be >= 1 (got {args.concurrency})", key="--concurrency")
    if args.concurrency > MAX_CONCURRENCY:
        raise ConfigError(
            f"must be at most {MAX_CONCURRENCY:,} (got {args.concurrency})", key="--concurrency"
        )
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(
                f"environment variable {args.api_key_env} is not set", key="--api-key-env"
            )
    w = _workload(args)
    # a duration-bounded run needs enough requests to stay busy for the whole window
    pool = max(_DEFAULT_NUM_REQUESTS, 20 * args.concurrency)
    _check_size(w, pool)
    options = load_options(w, concurrency=args.concurrency, api_key=api_key)
    return w, requests_for(w, num_requests=pool), options


def _check_url(url: str) -> None:
    """An http(s) URL with a host and a valid port (aiohttp would fail later, less clearly)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{url!r} is not a valid URL: {exc}", key="--url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:30000", key="--url"
        )
    if port == 0:
        raise ConfigError(f"port 0 in {url!r}: expected 1..65535", key="--url")


def _check_size(w: WorkloadSection, pool: int) -> None:
    """The request list is built in memory before the run: bound its tokens."""
    from tuner.studycheck import MAX_POOL_TOKENS

    n = w.num_requests or pool
    per = {"shared-prefix": w.prefix_len + w.question_len, "multi-turn": w.input_len * w.turns}
    longest = per.get(w.kind, w.input_len)
    count = w.num_groups * w.prompts_per_group if w.kind == "shared-prefix" else n
    if w.kind not in ("sharegpt", "jsonl") and count * longest > MAX_POOL_TOKENS:
        flag = "--prefix-len" if w.kind == "shared-prefix" else "--input-len"
        raise ConfigError(
            f"{count:,} requests of up to {longest:,} tokens exceed the "
            f"{MAX_POOL_TOKENS:,} prompt tokens tuner builds in memory",
            key=flag,
        )


def _workload(args: argparse.Namespace) -> WorkloadSection:
    """The flags as a WorkloadSection: its checks apply, their errors name the flag."""
    values: dict[str, Any] = {k: getattr(args, k) for k in _SAME_NAME}
    values.update(
        kind=args.workload,
        dataset=args.dataset,
        request_rate=args.request_rate,
        request_timeout_s=args.request_timeout,
    )
    num_requests = args.num_requests
    if num_requests is None and args.duration is None:
        num_requests = _DEFAULT_NUM_REQUESTS
    try:
        return WorkloadSection(
            **{k: v for k, v in values.items() if v is not None},
            # as bench_serving, a run is bounded by time only when asked (--duration)
            num_requests=num_requests,
            duration_s=args.duration,
            flush_cache=args.flush_cache,
            stream=not args.no_stream,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "kind"
        flag = _FLAG_OF.get(field, "--" + field.replace("_", "-"))
        # the message is WorkloadSection's own; only the key becomes the flag
        raise ConfigError(err["msg"].removeprefix("Value error, "), key=flag) from None


def run(args: argparse.Namespace) -> int:
    from tuner.loadgen import run_load_sync

    w, requests, options = _plan(args)
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
        "workload": w.kind,
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
