"""`tuner bench`: one load run against any running SGLang-compatible server.

Prints a bench_serving-like summary; `--json FILE` writes bench_serving's result keys plus the
tuner's additions (p90s, errors, the server's own view from /metrics, the client self-check);
`--output-file FILE` appends them as one JSON line, as bench_serving does.

It takes bench_serving's flag names for what it supports (`--base-url`, `--max-concurrency`,
`--num-prompts`, `--dataset-name`, `--dataset-path`, `--random-input-len`, ...; its backend and
dataset names: tuner.loadgen.names) beside tuner's own; a bench_serving option it does not
support (`--tokenizer`, `--profile`, ...) is one line and exit 2, never silently ignored.
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
from tuner.config.base import MAX_CONCURRENCY, host_problem
from tuner.config.workload import WorkloadSection
from tuner.errors import ConfigError, HostUnreachable, InfraError
from tuner.loadgen.names import BACKEND_ALIASES, BACKEND_NAME, DATASET_KINDS, backend_kind, run_keys

if TYPE_CHECKING:
    from tuner.loadgen.options import LoadOptions
    from tuner.loadgen.workload import Request

#: bench_serving's --num-prompts default, when neither a count nor a duration is given
_DEFAULT_NUM_REQUESTS = 1000
#: where bench_serving sends without --base-url (its --host default 0.0.0.0 is this machine)
_DEFAULT_HOST, _DEFAULT_PORT = "127.0.0.1", 30000
#: flags named by their dest where a value is checked outside the workload
_FLAG_OF_DEST = {"api_key_env": "--api-key-env", "model": "--model"}

#: WorkloadSection key -> the tuner flag that sets it (others: `--` + the key with dashes)
_FLAG_OF = {
    "kind": "--workload",
    "dataset": "--dataset",
    "duration_s": "--duration",
    "request_timeout_s": "--request-timeout",
    "stream": "--no-stream",
}
#: WorkloadSection key -> the argparse dest holding it, where they differ
_DEST_OF = {"kind": "workload", "duration_s": "duration", "request_timeout_s": "request_timeout"}

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
    "dataset_output_len",
    "warmup_requests",
    "seed",
    "model",
)

#: bench_serving's own names for tuner's flags (the same option, any name)
_ALIASES: dict[str, str | tuple[str, ...]] = {
    "--url": "--base-url",
    "--concurrency": "--max-concurrency",
    "--num-requests": "--num-prompts",
    "--dataset": "--dataset-path",
    "--input-len": "--random-input-len",
    "--output-len": ("--random-output-len", "--gsp-output-len"),  # random's and shared-prefix's
    "--range-ratio": "--random-range-ratio",
    "--dataset-output-len": "--sharegpt-output-len",
    "--num-groups": "--gsp-num-groups",
    "--prompts-per-group": "--gsp-prompts-per-group",
    "--prefix-len": "--gsp-system-prompt-len",
    "--question-len": "--gsp-question-len",
    "--no-stream": "--disable-stream",
    "--no-progress": "--disable-tqdm",
}
#: bench_serving options tuner bench does not support: refused by name, not ignored
_NOT_SUPPORTED = (
    "--tokenizer",
    "--sharegpt-context-len",
    "--output-details",
    "--return-logprob",
    "--disable-ignore-eos",
    "--extra-request-body",
    "--apply-chat-template",
    "--profile",
    "--lora-name",
    "--prompt-suffix",
    "--pd-separated",
    "--tokenize-prompt",
)


class _Typed(argparse.Action):
    """Store the value and remember which of the option's names was typed: an error about it
    names the flag the user wrote (`--max-concurrency`, not `--concurrency`)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        setattr(namespace, self.dest, values)
        namespace.typed = {**(getattr(namespace, "typed", None) or {}), self.dest: option_string}


class _NotSupported(argparse.Action):
    """A bench_serving option tuner bench does not have: one line, exit 2."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs="*", help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        parser.error(f"{option_string} is a bench_serving option tuner bench does not support")


def _choices(key: str) -> tuple[str, ...]:
    return get_args(WorkloadSection.model_fields[key].annotation)


def _default(key: str) -> str:
    return f"(default {WorkloadSection.model_fields[key].default})"


def _names(flag: str) -> list[str]:
    alias = _ALIASES.get(flag, ())
    return [flag, *((alias,) if isinstance(alias, str) else alias)]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="one load run against a running server (bench_serving's flag names work too)",
        epilog="bench_serving's --backend and --dataset-name values are accepted where tuner "
        "speaks the same API or builds the same prompts; its other options are refused.",
    )

    def opt(flag: str, **kw: Any) -> None:
        kw.setdefault("action", _Typed)
        p.add_argument(*_names(flag), **kw)

    opt("--url", help="server base URL (default http://127.0.0.1:30000, or --host/--port)")
    opt("--host", help=f"server host when no --url is given (default {_DEFAULT_HOST})")
    opt("--port", type=int, help=f"server port when no --url is given (default {_DEFAULT_PORT})")
    opt("--concurrency", type=int, required=True, help="closed-loop concurrency")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument(
        "--duration", type=float, action=_Typed, help="stop after S seconds (cancels in-flight)"
    )
    bound.add_argument(
        *_names("--num-requests"),
        type=int,
        action=_Typed,
        help=f"send N requests (default {_DEFAULT_NUM_REQUESTS})",
    )
    # an unset flag takes the study file's default (config.WorkloadSection); the defaults
    # given here are where bench_serving's conventions differ from a study's
    opt(
        "--backend",
        help=f"{', '.join(_choices('backend'))}, or bench_serving's "
        f"{', '.join(sorted({*BACKEND_NAME.values(), *BACKEND_ALIASES}))} {_default('backend')}",
    )
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--workload", choices=_choices("kind"), action=_Typed, help=_default("kind"))
    kind.add_argument(
        "--dataset-name",
        action=_Typed,
        help=f"bench_serving's name of the workload: {', '.join(DATASET_KINDS)}",
    )
    opt("--dataset", help="ShareGPT JSON/JSONL or prompts JSONL file")
    for key in ("input_len", "output_len"):
        opt("--" + key.replace("_", "-"), type=int, help=_default(key))
    # bench_serving's random lengths go down to 1 (a study's are exact by default)
    opt("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*r, L] (default 0)")
    opt("--dataset-output-len", type=int, help="output tokens of each dataset record")
    for key in ("num_groups", "prompts_per_group", "prefix_len", "question_len", "turns"):
        opt("--" + key.replace("_", "-"), type=int, help=_default(key))
    opt("--request-rate", type=float, help="Poisson rate (req/s); default (or inf) closed loop")
    opt("--warmup-requests", type=int, help=_default("warmup_requests"))
    # bench_serving flushes only when asked (a study flushes before every run by default)
    p.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before the run")
    opt(
        "--request-timeout", type=float, help="seconds per request " + _default("request_timeout_s")
    )
    opt("--api-key-env", metavar="NAME", help="environment variable holding the key")
    opt("--model", help="model name for OpenAI endpoints (default: /v1/models)")
    p.add_argument(*_names("--no-stream"), dest="no_stream", action="store_true")
    opt("--seed", type=int, help=_default("seed"))
    opt("--json", metavar="FILE", type=output_file, help="write the results as JSON")
    opt(
        "--output-file",
        metavar="FILE",
        type=output_file,
        help="append the results as one JSON line (bench_serving's JSONL)",
    )
    p.add_argument(*_names("--no-progress"), dest="no_progress", action="store_true")
    for flag in _NOT_SUPPORTED:
        p.add_argument(flag, action=_NotSupported)
    p.set_defaults(run=run, typed={})


def _flag(args: argparse.Namespace, key: str) -> str:
    """The flag that set WorkloadSection's `key`, as the user typed it."""
    if key == "kind" and args.dataset_name:
        return "--dataset-name"
    if key == "dataset" and args.dataset_name and args.dataset is None:
        return "--dataset-path"  # bench_serving's word for the file a dataset needs
    dest = _DEST_OF.get(key, key)
    return args.typed.get(dest) or _FLAG_OF.get(key, "--" + key.replace("_", "-"))


def _url(args: argparse.Namespace) -> str:
    """--url / --base-url, else http://HOST:PORT from --host and --port (bench_serving's way)."""
    if args.url is not None:
        if args.host is not None or args.port is not None:  # one of them would be ignored
            raise ConfigError(
                "give the server as --url, or as --host and --port, not both",
                key=args.typed.get("url") or "--url",
            )
        return args.url
    # `is None`, not falsy: an empty --host or --port 0 was silently the default
    host = _DEFAULT_HOST if args.host is None else args.host
    if problem := host_problem(host, "--port"):
        raise ConfigError(problem, key="--host")
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    return f"http://{host}:{_DEFAULT_PORT if args.port is None else args.port}"


def _plan(args: argparse.Namespace) -> tuple[WorkloadSection, list[Request], LoadOptions]:
    """Command-line values -> (workload, requests, options); bad values raise ConfigError."""
    from tuner.loadgen.options import load_options
    from tuner.loadgen.workload import requests_for

    given = args.url is not None
    args.url = _url(args)
    _check_url(args.url, args.typed.get("url") or ("--url" if given else "--port"))
    flag = args.typed.get("concurrency") or "--concurrency"
    if args.concurrency < 1:
        # not a workload key: in a study, concurrency is a searched parameter
        raise ConfigError(f"must be >= 1 (got {args.concurrency})", key=flag)
    if args.concurrency > MAX_CONCURRENCY:
        raise ConfigError(f"must be at most {MAX_CONCURRENCY:,} (got {args.concurrency})", key=flag)
    for key in ("api_key_env", "model"):  # "" would silently send no key, or no model name
        if getattr(args, key) is not None and not getattr(args, key).strip():
            raise ConfigError("expected a name, got an empty one", key=_FLAG_OF_DEST[key])
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(
                f"environment variable {args.api_key_env} is not set", key="--api-key-env"
            )
    w = _workload(args)
    # a duration-bounded run starts with this many; a random or multi-turn one gets more
    # when it runs low (loadgen.plan.refill_for), a finite one ends `exhausted` (warned)
    pool = max(_DEFAULT_NUM_REQUESTS, 20 * args.concurrency)
    _check_size(w, pool, args)
    options = load_options(w, concurrency=args.concurrency, api_key=api_key)
    return w, requests_for(w, num_requests=pool), options


def _check_url(url: str, flag: str = "--url") -> None:
    """An http(s) URL with a host and a valid port (aiohttp would fail later, less clearly)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{url!r} is not a valid URL: {exc}", key=flag) from None
    if parts.username is not None or parts.password is not None:
        # never echoed: the password would land on the terminal and in logs
        raise ConfigError(
            "a user or password in the URL is not sent: give the key through --api-key-env",
            key=flag,
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:30000", key=flag)
    if any(c.isspace() or not c.isprintable() for c in url):  # failed later as "cannot reach"
        raise ConfigError(f"{url!r} holds a space or a control character", key=flag)
    if parts.query or parts.fragment:  # the request paths are appended: ?x would swallow them
        raise ConfigError(f"{url!r}: expected the server's base URL, without ?query or #", key=flag)
    if problem := host_problem(parts.hostname, "the URL's :PORT"):
        # aiohttp refuses `999.0.0.1` per request, and the run "measured" nothing, exit 0
        raise ConfigError(f"{url!r}: {problem}", key=flag)
    if port == 0:
        raise ConfigError(f"port 0 in {url!r}: expected 1..65535", key=flag)


def _check_size(w: WorkloadSection, pool: int, args: argparse.Namespace) -> None:
    """The request list is built in memory before the run: bound its tokens."""
    from tuner.config.validate import MAX_POOL_TOKENS

    n = w.num_requests or pool
    per = {"shared-prefix": w.prefix_len + w.question_len, "multi-turn": w.input_len * w.turns}
    longest = per.get(w.kind, w.input_len)
    count = w.num_groups * w.prompts_per_group if w.kind == "shared-prefix" else n
    if w.kind not in ("sharegpt", "jsonl") and count * longest > MAX_POOL_TOKENS:
        key = "prefix_len" if w.kind == "shared-prefix" else "input_len"
        raise ConfigError(
            f"{count:,} requests of up to {longest:,} tokens exceed the "
            f"{MAX_POOL_TOKENS:,} prompt tokens tuner builds in memory",
            key=_flag(args, key),
        )


def _kind(args: argparse.Namespace) -> str | None:
    """--workload, or bench_serving's --dataset-name as tuner's workload kind."""
    if args.dataset_name is None:
        return args.workload
    kind = DATASET_KINDS.get(args.dataset_name)
    if kind is None:
        raise ConfigError(
            f"tuner bench builds {', '.join(DATASET_KINDS)} (and with --workload: "
            f"{', '.join(k for k in _choices('kind') if k not in DATASET_KINDS.values())}), "
            f"not {args.dataset_name!r}",
            key="--dataset-name",
        )
    return kind


def _backend(args: argparse.Namespace) -> str | None:
    """--backend in tuner's words (bench_serving's name of the same API accepted)."""
    if args.backend is None:
        return None
    kind = backend_kind(args.backend)
    if kind is None:
        raise ConfigError(
            f"{args.backend!r} is not an API tuner speaks: {', '.join(_choices('backend'))} "
            f"(or bench_serving's {', '.join(sorted({*BACKEND_NAME.values(), *BACKEND_ALIASES}))})",
            key="--backend",
        )
    return kind


def _workload(args: argparse.Namespace) -> WorkloadSection:
    """The flags as a WorkloadSection: its checks apply, their errors name the flag."""
    values: dict[str, Any] = {k: getattr(args, k) for k in _SAME_NAME}
    rate = args.request_rate
    values.update(
        backend=_backend(args),
        kind=_kind(args),
        dataset=args.dataset,
        # bench_serving's default rate is inf: every request at once, its concurrency the bound
        request_rate=None if rate is not None and math.isinf(rate) else rate,
        request_timeout_s=args.request_timeout,
    )
    num_requests = args.num_requests
    if num_requests is None and args.duration is None:
        num_requests = _DEFAULT_NUM_REQUESTS
    try:
        w = WorkloadSection(
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
        # the message is WorkloadSection's own; only the key becomes the flag
        raise ConfigError(
            err["msg"].removeprefix("Value error, "), key=_flag(args, field)
        ) from None
    # a flag the chosen workload would ignore is refused, as a study file's key is (only the
    # flags typed: an untyped one holds a default, e.g. --range-ratio's 0)
    given = {k for k in WorkloadSection.model_fields if _DEST_OF.get(k, k) in args.typed}
    if (found := w.ignored_key(given)) is not None:
        why = found[1]
        for word, flag in (("kind ", "--workload "), ("set kind", "set --workload")):
            why = why.replace(word, flag)
        why = why.replace("set backend", "set --backend")
        raise ConfigError(why, key=_flag(args, found[0]))
    return w


def run(args: argparse.Namespace) -> int:
    from tuner.loadgen.plan import refill_for
    from tuner.loadgen.run import run_load_sync

    w, requests, options = _plan(args)
    more = refill_for(w)
    if args.no_progress:
        result = run_load_sync(args.url, requests, options, more=more)
    else:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as progress:
            result = run_load_sync(args.url, requests, options, progress, more=more)
    m = result.metrics()
    if m.completed == 0 and m.errors and set(m.error_kinds) == {"connection"}:
        raise HostUnreachable(f"cannot reach {args.url}: every request failed to connect")
    if m.completed == 0 and m.window_output_throughput == 0:
        # a server that accepts and never answers measured nothing: exit 0 would read as a result
        why = "it went silent" if result.unresponsive else f"{m.errors} requests failed"
        raise InfraError(f"{args.url} answered no token ({why}): nothing was measured")
    rate = None if math.isinf(options.request_rate) else options.request_rate
    out: dict[str, Any] = {
        **run_keys(w, options.concurrency, rate),
        "workload": w.kind,
        **result.summary(),
    }
    _print_summary(out)
    if result.exhausted:
        import sys

        print(
            f"warning: every one of the {len(requests):,} {w.kind} requests was sent in "
            f"{result.duration_s:.1f} s of the {w.duration_s:g} s asked (--duration): the "
            "figures measure that shorter window; give more requests",
            file=sys.stderr,
        )
    if args.json:
        from tuner.report.export import write_text

        write_text(Path(args.json), json.dumps(out, indent=2) + "\n")
    if args.output_file:
        try:
            with Path(args.output_file).open("a") as f:  # bench_serving appends a line per run
                f.write(json.dumps(out) + "\n")
        except OSError as exc:
            raise InfraError(f"cannot write {args.output_file}: {exc.strerror or exc}") from None
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
