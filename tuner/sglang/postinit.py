"""SGLang's ServerArgs post-init as pure rules: flags -> the flags SGLang runs with, its warnings,
or the error it exits with. Pure.

    r = resolve({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True,
                 "chunked_prefill_size": 8192}, "0.5.6.post2")
    r.flags["chunked_prefill_size"]   # 1024
    r.warnings                        # ("DP attention is enabled. The chunked prefill size ...",)
    r.error                           # None, or a Refusal: SGLang's exception line, exit code 1
    r.attn_dp_size                    # 8: attention data-parallel groups (1: DP attention off)

Keys are ServerArgs field names (`tp_size`) or flag names (`tp-size`, `--tp-size`; the argparse
dests `tensor_parallel_size`, `data_parallel_size` are taken as the fields they fill). A key
left out has SGLang's default. `chunked_prefill_size`, `cuda_graph_max_bs` and
`mem_fraction_static` should carry what SGLang resolved from the GPU (`sglang.defaults`, or
`default_mem_fraction_static` below), as they do when these rules run; None skips a rule that
needs them. `model_arch` is `architectures[0]` of the model's config.json (None: an
architecture without SGLang's special cases).

What it plays, in SGLang's order (each rule names its source; paths under `sglang/srt/`):
  * 0.5.23 only: `--enable-dp-attention` is the deprecated spelling of `--attn-dp-size`
    (`arg_groups/parallel_hook.py:40-63`): attn_dp_size takes dp_size, dp_size becomes 1;
  * data parallelism: DP attention off at dp_size 1, `schedule_conservativeness x 0.3`,
    `tp_size % dp_size == 0`, `chunked_prefill_size // dp_size` with SGLang's warning
    (0.5.6.post2 `server_args.py:1563-1579`; 0.5.23 `arg_groups/parallel_hook.py:283-339`);
  * speculative decoding (`sglang.specargs`): NEXTN is EAGLE, max_running_requests 48 when
    unset, the overlap schedule (0.5.6.post2 only), topk 1 forcing num_draft_tokens = steps + 1,
    automatic steps/topk/draft tokens, the refusals with DP attention and paged trees.
`default_mem_fraction_static` adds what SGLang reserves for DP attention and speculative drafts
to the default mem-fraction-static (0.5.6.post2 `server_args.py:848-885`; 0.5.23
`arg_groups/memory_hook.py:277-399`, the DP term only). Rules of features the tuner does not
model (disaggregation, DFLASH/DSPARK/UNO drafts, adaptive speculation, ...) are not played.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.sglang import specargs

#: the versions whose rules are played; a newer one is played as 0.5.23 (see `is_new`)
OLD, NEW = "0.5.6.post2", "0.5.23"
#: an uncaught exception in ServerArgs' post-init ends the launch process with Python's code 1
EXIT_MAIN_EXCEPTION = 1

_ALIASES = {
    "tensor_parallel_size": "tp_size",
    "data_parallel_size": "dp_size",
    "pipeline_parallel_size": "pp_size",
    "attention_data_parallel_size": "attn_dp_size",
}
#: the fields these rules read, with SGLang's defaults (0.5.6.post2 ServerArgs; 0.5.23's agree)
DEFAULTS: Mapping[str, Any] = {
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": 1,
    "attn_dp_size": 1,
    "enable_dp_attention": False,
    "enable_dp_lm_head": False,
    "schedule_conservativeness": 1.0,
    "chunked_prefill_size": None,
    "max_prefill_tokens": 16384,
    "cuda_graph_max_bs": None,
    "max_running_requests": None,
    "page_size": 1,
    "attention_backend": None,
    "decode_attention_backend": None,
    "prefill_attention_backend": None,
    "disable_overlap_schedule": False,
    "enable_mixed_chunk": False,
    "model_path": None,
    "revision": None,
    **specargs.DEFAULTS,
}


@dataclass(frozen=True)
class Refusal:
    """SGLang's exception from its post-init: `ValueError: ...` (or a bare `AssertionError`)."""

    exception: str
    message: str = ""
    exit_code: int = EXIT_MAIN_EXCEPTION

    @property
    def line(self) -> str:
        """The last line of SGLang's traceback."""
        return f"{self.exception}: {self.message}" if self.message else self.exception


@dataclass(frozen=True)
class Resolved:
    """What SGLang starts with: every field read (`DEFAULTS`) plus the caller's others."""

    flags: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    error: Refusal | None = None

    @property
    def attn_dp_size(self) -> int:
        """Attention data-parallel groups (1 when DP attention is off), in either version."""
        f = self.flags
        if f.get("attn_dp_size", 1) > 1:
            return int(f["attn_dp_size"])
        return int(f["dp_size"]) if f.get("enable_dp_attention") else 1

    @property
    def speculative(self) -> bool:
        return self.flags.get("speculative_algorithm") is not None


class PostInitError(Exception):
    """Raised inside the rules; `resolve` turns it into `Resolved.error`."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.line)
        self.refusal = refusal


@dataclass
class State:
    """The flags being resolved and the warnings logged so far (the rules' working copy)."""

    version: str
    arch: str | None
    flags: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def new(self) -> bool:
        return is_new(self.version)

    def get(self, key: str) -> Any:
        return self.flags.get(key)

    def set(self, **values: Any) -> None:
        self.flags.update(values)

    def warn(self, line: str) -> None:
        self.warnings.append(line)

    def refuse(self, exception: str, message: str = "") -> PostInitError:
        return PostInitError(Refusal(exception, message))

    def attn_dp(self) -> int:
        """DP attention groups as resolved so far."""
        if self.new:
            return int(self.flags["attn_dp_size"])
        return int(self.flags["dp_size"]) if self.flags["enable_dp_attention"] else 1


def is_new(version: str) -> bool:
    """True for 0.5.23's rules (every version past 0.5.6.post2 the tuner knows)."""
    return version != OLD


def normalize(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Field names for `flags` (dashes, leading `--` and argparse dests folded), over DEFAULTS."""
    out = dict(DEFAULTS)
    for key, value in flags.items():
        name = key.lstrip("-").replace("-", "_")
        out[_ALIASES.get(name, name)] = value
    if out.get("page_size") is None:  # resolved before these rules (0.5.6.post2 :1552)
        out["page_size"] = 1
    return out


def resolve(flags: Mapping[str, Any], version: str, model_arch: str | None = None) -> Resolved:
    """SGLang's post-init of `flags` on `version` (module docstring): the flags it runs with,
    its warnings in order, or the refusal that ends the launch (exit code 1)."""
    st = State(version, model_arch, normalize(flags))
    try:
        if st.new:
            _deprecated_dp_attention(st)
        _data_parallelism(st)
        specargs.apply(st)
    except PostInitError as exc:
        return Resolved(st.flags, tuple(st.warnings), exc.refusal)
    return Resolved(st.flags, tuple(st.warnings), None)


def _deprecated_dp_attention(st: State) -> None:
    """0.5.23 `arg_groups/parallel_hook.py:40-63`: `--dp-size N --enable-dp-attention` is
    `--attn-dp-size N`; dp_size counts replicas again. (argparse already warned that the flag
    is deprecated, `arg_groups/argparse_actions.py:95-100`.)"""
    if not st.get("enable_dp_attention"):
        return
    if st.get("attn_dp_size") == 1:
        st.set(attn_dp_size=st.get("dp_size"), dp_size=1)
    st.set(enable_dp_attention=False)


def _data_parallelism(st: State) -> None:
    """`_handle_data_parallelism` of the version (module docstring)."""
    if st.new:
        _data_parallelism_new(st)
        return
    # 0.5.6.post2 server_args.py:1563-1579
    if st.get("dp_size") == 1:
        st.set(enable_dp_attention=False, enable_dp_lm_head=False)
    if st.get("enable_dp_attention"):
        st.set(schedule_conservativeness=st.get("schedule_conservativeness") * 0.3)
        if st.get("tp_size") % st.get("dp_size"):
            raise st.refuse("AssertionError")
        chunk = st.get("chunked_prefill_size")
        if chunk is not None:
            chunk //= st.get("dp_size")
            st.set(chunked_prefill_size=chunk)
        st.warn(
            f"DP attention is enabled. The chunked prefill size is adjusted to {chunk} to avoid "
            "MoE kernel issues. "
        )
    if st.get("enable_dp_lm_head") and not st.get("enable_dp_attention"):
        raise st.refuse(
            "AssertionError", "Please enable dp attention when setting enable_dp_lm_head. "
        )


def _data_parallelism_new(st: State) -> None:
    """0.5.23 `arg_groups/parallel_hook.py:276-339` (and `overrides.py:1367-1370`)."""
    attn_dp = st.get("attn_dp_size")
    if attn_dp < 1:
        raise st.refuse("ValueError", f"--attn-dp-size must be positive (got {attn_dp}).")
    if attn_dp > 1 and st.get("dp_size") > 1:
        raise st.refuse(
            "ValueError",
            f"--dp-size {st.get('dp_size')} with --attn-dp-size {attn_dp}: data-parallel "
            "replicas combined with attention data parallelism are not supported.",
        )
    if st.get("dp_size") * attn_dp == 1:
        st.set(enable_dp_lm_head=False)
    if attn_dp > 1:
        st.set(schedule_conservativeness=st.get("schedule_conservativeness") * 0.3)
        if st.get("tp_size") % attn_dp:
            raise st.refuse("AssertionError")
        before = st.get("chunked_prefill_size")
        after = before // attn_dp if before is not None else None
        st.set(chunked_prefill_size=after)
        st.warn(
            f"DP attention is enabled. chunked prefill size is adjusted from {before} to {after}."
        )


# --- the default mem-fraction-static ----------------------------------------------------------


def default_mem_fraction_static(
    gpu_mem_mib: float, flags: Mapping[str, Any], version: str
) -> float:
    """SGLang's default `--mem-fraction-static` for this GPU (MiB, as nvidia-smi reports it),
    with the reserves for DP attention and speculative drafts.

    `flags` as for `resolve`, before it (this runs first in SGLang), with the GPU-derived
    `chunked_prefill_size` and `cuda_graph_max_bs` filled in. 0.5.6.post2
    `server_args.py:848-885`: 512 + 1.5 x max(chunked prefill, 2048) (max_prefill_tokens when
    chunking is off) + 2 x graph bs + tp x pp / 8 GiB; DP attention adds 3 MiB per graph batch
    per DP rank (1.5 more past bs 300); at least 10 GiB on GPUs over 60 GiB; then 2 GiB for an
    EAGLE draft (6 GiB STANDALONE, none NGRAM). 0.5.23 `arg_groups/memory_hook.py:306-317` and
    `:362-378`: the same DP term, no draft term (its other reserves are not played)."""
    f = normalize(flags)
    chunk, bs = f["chunked_prefill_size"], f["cuda_graph_max_bs"] or 0
    reserved = 512.0
    if chunk is not None and chunk > 0:
        reserved += max(chunk, 2048) * 1.5
    else:
        reserved += max(f["max_prefill_tokens"], 2048) * 1.5
    reserved += bs * 2
    reserved += f["tp_size"] * f["pp_size"] / 8 * 1024
    groups = dp_attention_groups(f, version)
    if groups > 1:
        reserved += bs * groups * 3
        if bs > 300:
            reserved += bs * groups * 1.5
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    algorithm = f["speculative_algorithm"]
    if not is_new(version) and algorithm is not None:
        if algorithm == "STANDALONE":
            reserved += 6 * 1024
        elif algorithm != "NGRAM":
            reserved += 2 * 1024
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def dp_attention_groups(flags: Mapping[str, Any], version: str) -> int:
    """DP attention groups the flags ask for, before post-init (1: off)."""
    f = normalize(flags)
    if is_new(version) and f["attn_dp_size"] > 1:
        return int(f["attn_dp_size"])
    dp = int(f["dp_size"])
    return dp if f["enable_dp_attention"] and dp > 1 else 1


def refusal_messages() -> tuple[str, ...]:
    """Distinctive parts of every message `resolve` can refuse with (both versions): text a
    failure classifier can find in the log line (`sglang.failures` does not know them yet)."""
    return (
        "Please enable dp attention when setting enable_dp_lm_head",
        "--attn-dp-size must be positive",
        "data-parallel replicas combined with attention data parallelism are not supported",
        *specargs.REFUSALS,
    )
