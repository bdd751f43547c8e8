"""A parsed study file checked against what SGLang, the model and this machine will accept.

`config.load.parse_study` calls `check_study` once the schema holds, so every mistake below is one
line naming the file and key before anything is written or started:

- flag names under `server:`, `space:` and `baseline:` resolve in tuner's SGLang table (an
  alias or a unique prefix, as SGLang's argparse resolves them); a near miss gets "did you
  mean". The table holds the flags the tuner knows, not all of SGLang's: a real flag it lacks
  is listed in `target.unchecked_flags` and passed as given (SGLang then judges it);
- flag values by the table's types (int, float, switch, choices) and SGLang's ranges
  (mem-fraction in (0, 1), sizes non-negative whole numbers), for fixed values, searched
  ranges and choices alike;
- secrets (a flag named ...key, ...token, ...secret, ...password) never in the file;
- the baseline inside the space (range, step grid, choices), as optuna would otherwise warn;
- request lengths within the model's context, and the request list (built in memory up front)
  within `MAX_POOL_TOKENS`; the load window shorter than the trial's timeout; a shared-prefix
  count no larger than its groups hold (each prompt is sent once);
- the client's concurrency: searched (space.concurrency) or fixed (workload.concurrency), not
  both (with neither, `tune` refuses the study unless a request rate leaves it uncapped);
- a fixed parallel layout and speculation SGLang refuses before it loads anything
  (`capacity.layout.launch_problem`: DP attention whose dp does not divide tp, ...); when one
  of those flags is searched, the refusal is that trial's (the pre-check's), not the file's.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from tuner.capacity.calculus import GB
from tuner.capacity.precheck import hicache_ram_problem, launch_problem, parallel_of
from tuner.config.base import MAX_CONCURRENCY, MAX_TOKENS
from tuner.config.kubernetes import kubernetes_problem
from tuner.config.nodes import nodes_problem, owned_flag
from tuner.config.schema import StudyConfig
from tuner.config.slurm import slurm_problem
from tuner.config.space import CLIENT_PARAMS, ParamSpec
from tuner.config.target import target_problem
from tuner.errors import ConfigError, TunerError
from tuner.loadgen.workload import DEFAULT_POOL, request_pool
from tuner.search.mode import mode_problem
from tuner.search.sampler import sampler_problem
from tuner.search.space import ordered
from tuner.server.launch import is_secret_name
from tuner.sglang.argtypes import BOOLEAN_OPTIONAL
from tuner.sglang.flags import (
    KNOWN_VERSIONS,
    SPEC_ALGORITHM,
    canonical_flag,
    flags_for,
    full_name,
    speculation_off,
)
from tuner.sglang.tables import STORE_TRUE, Flag

__all__ = ["DEFAULT_POOL", "request_pool"]  # their old home: callers import them from here

#: prompt tokens the request list may hold in all (~36 bytes each as Python ints: ~1.2 GB)
MAX_POOL_TOKENS = 32_000_000
#: the actions whose values are true/false (`--x`, or `--x/--no-x`)
SWITCHES = (STORE_TRUE, BOOLEAN_OPTIONAL)
#: int flags SGLang needs >= 1 (every other int flag: >= 0)
_AT_LEAST_ONE = frozenset(
    {
        *("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"),
        *("expert-parallel-size", "nnodes", "page-size", "stream-interval", "context-length"),
        *("num-continuous-decode-steps", "max-running-requests", "max-total-tokens"),
        *("max-prefill-tokens", "cuda-graph-max-bs", "cuda-graph-max-bs-decode"),
        *("cuda-graph-max-bs-prefill", "torch-compile-max-bs", "decode-log-interval"),
    }
)
#: float flags that are fractions: (low, high, low included, high included)
_FRACTIONS = {
    "mem-fraction-static": (0.0, 1.0, False, False),
    "hicache-host-memory-fraction": (0.0, 1.0, False, True),
}


def check_study(cfg: StudyConfig) -> None:
    """Raise ConfigError (file + key) for the first thing SGLang or this machine would refuse."""
    table = flags_for()
    unchecked = set(cfg.target.unchecked_flags)
    for section, names in (("server", cfg.server), ("space", cfg.space)):
        for name in names:
            _check_name(cfg, section, name, table, unchecked)
            _raise_if(cfg, f"{section}.{name}", owned_flag(name))
    for name, value in cfg.server.items():
        if (flag := _flag(name, table)) is not None:
            _raise_if(cfg, f"server.{name}", value_problem(flag, value))
    for name, spec in cfg.space.items():
        _raise_if(cfg, f"space.{name}", _space_problem(name, spec, table))
    try:
        ordered(cfg.space)
    except ValueError as exc:
        raise ConfigError(str(exc).removeprefix("space: "), file=cfg.source, key="space") from None
    for name, value in (cfg.baseline or {}).items():
        _raise_if(cfg, f"baseline.{name}", _baseline_problem(value, cfg.space[name]))
    if (inner := mode_problem(cfg)) is not None:
        _raise_if(cfg, *inner)
    if (sampler := sampler_problem(cfg)) is not None:
        _raise_if(cfg, *sampler)
    _check_workload(cfg)
    _raise_if(cfg, *_launch_problem(cfg))
    _check_host_ram(cfg)
    if cfg.target.kubernetes is not None:  # first: it refuses a container: or slurm: beside it
        _raise_if(cfg, *kubernetes_problem(cfg.target, cfg.server))
    if cfg.target.container is not None:
        _raise_if(cfg, *target_problem(cfg.target.launch, cfg.target.workdir))
    if cfg.target.slurm is not None:
        _raise_if(cfg, *slurm_problem(cfg.target, cfg.server))
    if cfg.target.nodes is not None:
        _raise_if(cfg, *nodes_problem(cfg.target, cfg.server, cfg.space))
    _raise_if(cfg, *_concurrency_problem(cfg))


def _raise_if(cfg: StudyConfig, key: str, problem: str | None) -> None:
    if problem:
        raise ConfigError(problem, file=cfg.source, key=key)


def _flag(name: str, table: Mapping[str, Flag]) -> Flag | None:
    canonical = canonical_flag(name)
    return table.get(canonical) if canonical else _newer_flag(name)


def _newer_flag(name: str) -> Flag | None:
    """The flag a newer SGLang than the default table's knows by that name (`enable-hicache`,
    `cuda-graph-max-bs-decode`): the study may target it; `tuner check` and the export judge
    the host's own version."""
    for version in reversed(KNOWN_VERSIONS[1:]):
        if (canonical := canonical_flag(name, version)) is not None:
            return flags_for(version)[canonical]
    return None


def is_secret(name: str) -> bool:
    """Does a flag's name say it holds a secret (`api-key`, `hf-token`, `db-password`)? One rule
    with the launch's masking (server.launch.is_secret_name): `max-total-tokens`, a number or a switch,
    does not."""
    return is_secret_name(name)


def _check_name(
    cfg: StudyConfig, section: str, name: str, table: Mapping[str, Flag], unchecked: set[str]
) -> None:
    key = f"{section}.{name}"
    canonical = canonical_flag(name)
    if is_secret(name) or (canonical and is_secret(canonical)):
        where = (
            "put the key in an environment variable and name it in target.api_key_env"
            if "api" in name.split("-")
            else "give it to the server through the host's environment (the API key: "
            "target.api_key_env)"
        )
        raise ConfigError(
            f"a secret does not belong in the study file (it would reach logs, files and "
            f"`ps`): {where}",
            file=cfg.source,
            key=key,
        )
    if name in CLIENT_PARAMS:
        if section == "server":
            raise ConfigError(
                f"{name} is the load's, not a server flag: search it under space:",
                file=cfg.source,
                key=key,
            )
        return
    if canonical is not None or name in unchecked or _newer_flag(name) is not None:
        return
    near = difflib.get_close_matches(name, [*table, *CLIENT_PARAMS], n=1, cutoff=0.8)
    hint = f"did you mean {near[0]}? " if near else ""
    raise ConfigError(
        f"unknown SGLang flag: {hint}(a real flag tuner's table lacks goes in "
        "target.unchecked_flags to be passed as given)",
        file=cfg.source,
        key=key,
    )


def _type_name(flag: Flag) -> str:
    return {int: "a whole number", float: "a number"}.get(flag.type, "a string")  # type: ignore[call-overload]


def value_problem(flag: Flag, value: Any) -> str | None:
    """What SGLang's argparse (or its own checks) would refuse in this value; None if fine.
    tuner's own word for "off" is fine where the launch drops it (`speculative-algorithm:
    none`, `sglang.flags.effective_flags`)."""
    if flag.name == SPEC_ALGORITHM and speculation_off(value):
        return None
    if flag.action in SWITCHES:
        if not isinstance(value, bool):
            return f"a switch: expected true or false (got {value!r})"
        return None
    if isinstance(value, bool):
        return f"expected {_type_name(flag)}, not {value!r} (SGLang's type is {_tname(flag)})"
    if isinstance(value, list):
        if flag.nargs is None:
            return f"expected one value, got a list {value!r}"
        if not value:
            return "expected at least one value"
        return next((p for v in value if (p := value_problem(_single(flag), v))), None)
    if flag.type is int:
        if isinstance(value, float) or (isinstance(value, str) and not _parses(int, value)):
            return f"expected a whole number (SGLang's type is int), got {value!r}"
        return _range_problem(flag.name, int(value), int)
    if flag.type is float:
        if isinstance(value, str) and not _parses(float, value):
            return f"expected a number, got {value!r}"
        if not math.isfinite(float(value)):
            return f"expected a finite number, got {value!r}"
        return _range_problem(flag.name, float(value), float)
    if flag.choices is not None and str(value) not in flag.choices:
        return f"expected one of {', '.join(map(str, flag.choices))} (got {value!r})"
    return None


def _tname(flag: Flag) -> str:
    return getattr(flag.type, "__name__", "str")


def _single(flag: Flag) -> Flag:
    from dataclasses import replace

    return replace(flag, nargs=None)


def _parses(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _range_problem(name: str, v: float, kind: type) -> str | None:
    if name in _FRACTIONS:
        low, high, lo_in, hi_in = _FRACTIONS[name]
        if not ((v >= low) if lo_in else (v > low)) or not ((v <= high) if hi_in else (v < high)):
            ends = ("[" if lo_in else "(") + f"{low:g}, {high:g}" + ("]" if hi_in else ")")
            return f"expected a fraction in {ends}, got {v:g}"
        return None
    if name == "port" and not 1 <= v <= 65535:
        return f"expected a port in 1..65535, got {v:g}"
    if name == "chunked-prefill-size" and v != -1 and v < 1:
        return f"expected -1 (off) or a positive size, got {v:g}"
    if name in _AT_LEAST_ONE and v < 1:
        return f"expected a positive whole number, got {v:g}"
    if name != "chunked-prefill-size" and v < 0:
        what = "whole number" if kind is int else "number"
        return f"expected a non-negative {what}, got {v:g}"
    return None


def _space_problem(name: str, spec: ParamSpec, table: Mapping[str, Flag]) -> str | None:
    """A searched range or choice list SGLang (or the load) would refuse at either end."""
    if name == "concurrency":
        if spec.kind != "int" and spec.kind != "categorical":
            return "concurrency is a number of open requests: give whole-number low and high"
        ends = spec.choices if spec.kind == "categorical" else [spec.low, spec.high]
        for v in ends or []:
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not 1 <= v <= MAX_CONCURRENCY
                or (spec.kind == "categorical" and not isinstance(v, int))
            ):
                return f"expected whole numbers in 1..{MAX_CONCURRENCY:,}, got {v!r}"
        return None
    if name == "request-rate":
        ends = spec.choices if spec.kind == "categorical" else [spec.low, spec.high]
        bad = [
            v for v in ends or [] if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0
        ]
        return f"expected request rates > 0 (req/s), got {bad[0]!r}" if bad else None
    flag = _flag(name, table)
    if flag is None:
        return None  # target.unchecked_flags: SGLang judges it
    kind = spec.kind
    if flag.action in SWITCHES:
        if kind == "bool" or (
            kind == "categorical" and all(isinstance(c, bool) for c in spec.choices or [])
        ):
            return None
        return "a switch: search it with `type: bool` (or choices [false, true])"
    if kind == "bool":
        return f"not a switch: SGLang's type is {_tname(flag)}; give low/high or choices"
    if kind == "categorical":
        return next(
            (f"choice {p}" for c in spec.choices or [] if (p := value_problem(flag, c))), None
        )
    if flag.type is int and kind != "int":
        return "SGLang's type is int: give whole-number low, high and step (or `type: int`)"
    if flag.type not in (int, float):
        return f"SGLang's type is {_tname(flag)}: search it with choices, not low/high"
    for end in ("low", "high"):
        v = getattr(spec, end)
        if (p := value_problem(flag, int(v) if kind == "int" else v)) is not None:
            return f"{end}: {p}"
    return None


def _baseline_problem(value: Any, spec: ParamSpec) -> str | None:
    """Is the baseline a point of the space (optuna only warns, then runs it anyway)?"""
    kind = spec.kind
    if kind in ("categorical", "bool"):
        choices = [False, True] if kind == "bool" else list(spec.choices or [])
        if value in choices and type(value) in {type(c) for c in choices}:
            return None
        return f"{value!r} is not one of the space's choices {choices}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number in [{spec.low:g}, {spec.high:g}], got {value!r}"
    assert spec.low is not None and spec.high is not None  # ParamSpec guarantees a range here
    if kind == "int" and value != int(value):
        return f"expected a whole number (the space is int), got {value!r}"
    if not spec.low <= value <= spec.high:
        return f"{value:g} is outside the space [{spec.low:g}, {spec.high:g}]"
    if spec.step:
        k = (value - spec.low) / spec.step
        if abs(k - round(k)) > 1e-6:
            below, above = (
                round(spec.low + i * spec.step, 10) for i in (math.floor(k), math.ceil(k))
            )
            return (
                f"{value:g} is off the space's grid ({spec.low:g} + k x {spec.step:g}): "
                f"use {below:g} or {above:g}"
            )
    return None


def _context_len(cfg: StudyConfig) -> tuple[int, str]:
    """The longest request SGLang will take, and where that figure comes from."""
    given = cfg.server.get("context-length")
    if isinstance(given, int) and not isinstance(given, bool):
        return given, "server.context-length"
    if cfg.hardware.model_config_path:
        from tuner.capacity.calculus import context_length
        from tuner.capacity.models import load_model_config

        try:
            model = load_model_config(cfg.hardware.model_config_path)
        except (TunerError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: capacity.models reads the file as text without catching it
            reason = exc if isinstance(exc, TunerError) else "not UTF-8 text"
            raise ConfigError(str(reason), file=cfg.source, key="hardware.model_config") from None
        try:
            n = context_length(model)
        except TunerError as exc:  # the field names itself, not its file
            where = f"{cfg.hardware.model_config_path}: {exc}"
            raise ConfigError(where, file=cfg.source, key="hardware.model_config") from None
        if n is not None:
            return n, f"the model's context length ({cfg.hardware.model_config_path})"
    return MAX_TOKENS, "tuner's cap on request length"


#: the flags `launch_problem` judges together: all fixed, or the judgement is each trial's
LAYOUT_FLAGS = frozenset(
    {
        *("tensor-parallel-size", "data-parallel-size", "pipeline-parallel-size"),
        *("enable-dp-attention", "attn-dp-size", "speculative-algorithm"),
        *("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"),
    }
)


def _launch_problem(cfg: StudyConfig) -> tuple[str, str | None]:
    """(key, why) when the fixed layout or speculation cannot start in any trial."""
    names = {full_name(k): k for k in cfg.server}
    searched = {full_name(k) for k in cfg.space}
    if searched & LAYOUT_FLAGS:
        return "server", None
    problem = launch_problem(cfg.server)
    about = ("speculative-",) if problem and "speculative" in problem else ("data-", "attn-dp")
    key = next((f"server.{k}" for n, k in names.items() if n.startswith(about)), "server")
    return key, problem


def _check_host_ram(cfg: StudyConfig) -> None:
    """A fixed `hicache-size` (or the low end of a searched one) that cannot fit in the host's
    RAM for the study's TP x DP dooms every trial: refuse it now, not after a night of starts."""
    ram = cfg.hardware.host_ram_gb
    if ram is None:
        return
    ranks = parallel_of(cfg.server).ranks
    fixed = {canonical_flag(k): (f"server.{k}", v) for k, v in cfg.server.items()}
    searched = {canonical_flag(k): (f"space.{k}", spec) for k, spec in cfg.space.items()}
    if "hicache-size" in fixed:
        key, value = fixed["hicache-size"]
        sizes = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []
    elif "hicache-size" in searched:
        key, spec = searched["hicache-size"]
        sizes = [spec.low] if spec.low is not None else list(spec.choices or [])
    else:
        return
    problems = [
        hicache_ram_problem(float(v), ram * GB, ranks)
        for v in sizes
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    ]
    if problems and all(problems):
        raise ConfigError(
            f"{problems[0]} (hardware.host_ram_gb); lower it", file=cfg.source, key=key
        )


def _concurrency_problem(cfg: StudyConfig) -> tuple[str, str | None]:
    """(key, why) when the client's concurrency is set twice (why None: fine). Not set at all
    is refused when a study runs (loadgen.plan.unset_concurrency)."""
    spec = cfg.space.get("concurrency")
    if cfg.workload.concurrency is not None and spec is not None and not spec.when:
        why = "concurrency is also searched under space.concurrency: drop one of them"
        return "workload.concurrency", why
    return "workload.concurrency", None


def _check_workload(cfg: StudyConfig) -> None:
    """Lengths within the context, the request list within memory, the window within a trial."""
    w = cfg.workload
    if w.duration_s is not None and w.duration_s >= cfg.budget.trial_timeout:
        raise ConfigError(
            f"({w.duration_s:g} s) must be below budget.trial_timeout "
            f"({cfg.budget.trial_timeout:g} s): every trial would time out",
            file=cfg.source,
            key="workload.duration_s",
        )
    if w.kind in ("sharegpt", "jsonl"):
        return  # a dataset's lengths are its own, and its size bounds the list
    stretch = 4 if w.length_dist == "lognormal" else 1  # workload.sample_length clips at 4 L
    out = w.output_len * stretch
    n = request_pool(cfg)
    if w.kind == "random":
        key, longest = "workload.input_len", w.input_len * stretch
        total, list_key = n * longest, key
    elif w.kind == "shared-prefix":
        key, longest = "workload.prefix_len", w.prefix_len + w.question_len
        n = w.num_groups * w.prompts_per_group
        if w.num_requests is not None and w.num_requests > n:
            raise ConfigError(
                f"({w.num_requests:,}) is more than the {n:,} prompts num_groups x "
                "prompts_per_group make; each is sent once (a repeat would hit the prefix "
                "cache): lower it, or raise num_groups or prompts_per_group",
                file=cfg.source,
                key="workload.num_requests",
            )
        total = n * longest
        # the list's size is the groups' count as much as the lengths: name the larger factor
        list_key = key if longest >= n else "workload.num_groups"
    else:  # multi-turn: each turn carries the whole conversation so far
        key = "workload.turns"
        first, grow = w.input_len * stretch, out + w.question_len
        longest = first + (w.turns - 1) * grow
        total = math.ceil(n / w.turns) * (w.turns * first + grow * w.turns * (w.turns - 1) // 2)
        list_key = key
    context, source = _context_len(cfg)
    if longest + out > context:
        raise ConfigError(
            f"the longest request ({longest:,} prompt + {out:,} output tokens) exceeds "
            f"{context:,} tokens, {source}",
            file=cfg.source,
            key=key,
        )
    if total > MAX_POOL_TOKENS:
        raise ConfigError(
            f"the request list would hold {total:,} prompt tokens ({n:,} requests), more than "
            f"the {MAX_POOL_TOKENS:,} tuner builds in memory: lower the lengths or "
            "the number of requests",
            file=cfg.source,
            key=list_key,
        )
