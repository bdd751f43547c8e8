"""SGLang's launch flags as records, per version (server_args.py). Pure data.

`BASE_TABLE` is v0.5.6.post2 as the tuner and the simulator use it; a later version is a
`VersionDelta` on an earlier one (flags removed, flags added, aliases added), so adding SGLang's
complete tables, or a new release, is adding records here: `flags.py` holds no flag names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STORE_TRUE = "store_true"


@dataclass(frozen=True)
class Flag:
    """One launch flag as SGLang's argparse declares it.

    `name` is the canonical dashed name without `--` (SGLang's first option string); `aliases`
    are its other option strings; `dest` is the ServerArgs field (what /get_server_info reports).
    A store_true flag has `action="store_true"`, no type, default False.
    """

    name: str
    aliases: tuple[str, ...] = ()
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple[Any, ...] | None = None
    nargs: str | None = None
    action: str | None = None
    help: str = ""
    required: bool = False
    dest: str = ""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.name.replace("-", "_"))

    @property
    def option_strings(self) -> tuple[str, ...]:
        """`--name` and every `--alias`, as argparse registers them."""
        return tuple(f"--{n}" for n in (self.name, *self.aliases))


@dataclass(frozen=True)
class VersionDelta:
    """How one version's flags differ from an earlier one's."""

    base: str
    #: flag -> the flags that replaced it (empty: gone without a successor)
    removed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    added: tuple[Flag, ...] = ()
    #: canonical flag -> aliases this version added to it
    new_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _str(name: str, default: Any = None, *, choices: Any = None, **kw: Any) -> Flag:
    return Flag(name, type=str, default=default, choices=choices and tuple(choices), **kw)


def _int(name: str, default: Any = None, **kw: Any) -> Flag:
    return Flag(name, type=int, default=default, **kw)


def _float(name: str, default: Any = None, **kw: Any) -> Flag:
    return Flag(name, type=float, default=default, **kw)


def _on(name: str, help: str = "") -> Flag:
    return Flag(name, action=STORE_TRUE, default=False, help=help)


SCHEDULE_POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority")
HICACHE_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
HICACHE_MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
HICACHE_STORAGE_BACKENDS = ("file", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic")
#: the same names and order as capacity.KV_DTYPES (a test keeps them equal)
KV_CACHE_DTYPES = (
    "auto",
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp4_e2m1",
)
ATTENTION_BACKENDS = (
    *("aiter", "ascend", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "torch_native"),
    *("triton", "trtllm_mha", "trtllm_mla"),
)
QUANTIZATIONS = (
    *("awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf"),
    *("modelopt", "modelopt_fp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "compressed-tensors"),
    "mxfp4",
)
LOAD_FORMATS = (
    *("auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes"),
    *("layered", "remote"),
)
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

BASE_VERSION = "0.5.6.post2"

BASE_TABLE: tuple[Flag, ...] = (
    # model and tokenizer
    _str("model-path", aliases=("model",), required=True, help="model dir or hub id"),
    _str("tokenizer-path"),
    _str("tokenizer-mode", "auto", choices=("auto", "slow")),
    _on("skip-tokenizer-init"),
    _str("load-format", "auto", choices=LOAD_FORMATS),
    _on("trust-remote-code"),
    _int("context-length"),
    _on("is-embedding"),
    _str("revision"),
    _str("dtype", "auto", choices=DTYPES),
    _str("quantization", choices=QUANTIZATIONS),
    _str("kv-cache-dtype", "auto", choices=KV_CACHE_DTYPES),
    _str("served-model-name"),
    _str("chat-template"),
    _str("device", "cuda"),
    # HTTP server
    _str("host", "127.0.0.1"),
    _int("port", 30000),
    _str("api-key"),
    _on("skip-server-warmup"),
    _float("watchdog-timeout", 300),
    # memory and scheduling (None: computed from the GPU, see defaults.py)
    _float("mem-fraction-static"),
    _int("max-running-requests"),
    _int("max-queued-requests"),
    _int("max-total-tokens"),
    _int("chunked-prefill-size"),
    _int("max-prefill-tokens", 16384),
    _str("schedule-policy", "fcfs", choices=SCHEDULE_POLICIES),
    _float("schedule-conservativeness", 1.0),
    _int("page-size", 1),
    _int("cuda-graph-max-bs"),
    _int("cuda-graph-bs", nargs="+"),
    _on("disable-cuda-graph"),
    _on("enable-piecewise-cuda-graph"),
    _on("enable-torch-compile"),
    _int("torch-compile-max-bs", 32),
    _on("disable-overlap-schedule"),
    _on("enable-mixed-chunk"),
    _int("num-continuous-decode-steps", 1),
    _str("attention-backend", choices=ATTENTION_BACKENDS),
    _int("stream-interval", 1),
    _on("stream-output"),
    _int("random-seed"),
    # parallelism: SGLang's fields are tp_size etc.; `--tp`/`--dp` work by argparse prefix
    _int("tensor-parallel-size", 1, aliases=("tp-size",), dest="tp_size"),
    _int("pipeline-parallel-size", 1, aliases=("pp-size",), dest="pp_size"),
    _int("data-parallel-size", 1, aliases=("dp-size",), dest="dp_size"),
    _int("expert-parallel-size", 1, aliases=("ep-size",), dest="ep_size"),
    _on("enable-dp-attention"),
    _int("nnodes", 1),
    _int("node-rank", 0),
    _str("dist-init-addr"),
    _int("base-gpu-id", 0),
    _on("disable-custom-all-reduce"),
    # logging and metrics
    _str("log-level", "info"),
    _on("log-requests"),
    _on("show-time-cost"),
    _on("enable-metrics"),
    _on("enable-cache-report"),
    _int("decode-log-interval", 40),
    _str("tool-call-parser"),
    _str("reasoning-parser"),
    # prefix cache and HiCache
    _on("disable-radix-cache"),
    _on("enable-hierarchical-cache"),
    _float("hicache-ratio", 2.0),
    _int("hicache-size", 0, help="host pool per rank in GB (1e9 bytes)"),
    _str("hicache-write-policy", "write_through", choices=HICACHE_WRITE_POLICIES),
    _str("hicache-io-backend", "kernel", choices=("direct", "kernel")),
    _str("hicache-mem-layout", "layer_first", choices=HICACHE_MEM_LAYOUTS),
    _str("hicache-storage-backend", choices=HICACHE_STORAGE_BACKENDS),
    _str(
        "hicache-storage-prefetch-policy",
        "best_effort",
        choices=("best_effort", "wait_complete", "timeout"),
    ),
    # SGLang's own YAML launch config (sglang-reference.md section 1)
    _str("config", help="SGLang YAML launch config (flat, dashed keys)"),
)

#: version -> how it differs from its base (sglang-reference.md section 9)
DELTAS: dict[str, VersionDelta] = {
    "0.5.23": VersionDelta(
        base=BASE_VERSION,
        removed={
            "cuda-graph-max-bs": ("cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"),
            "cuda-graph-bs": ("cuda-graph-bs-decode", "cuda-graph-bs-prefill"),
            "stream-output": (),
            "enable-piecewise-cuda-graph": (),
        },
        added=(
            _int("cuda-graph-max-bs-decode"),
            _int("cuda-graph-max-bs-prefill"),
            _int("cuda-graph-bs-decode", nargs="+"),
            _int("cuda-graph-bs-prefill", nargs="+"),
            # bounds the host pool only when neither --hicache-ratio nor --hicache-size is given
            _float("hicache-host-memory-fraction"),
            _str("hicache-host-memory-mode", "cache", choices=("cache", "buffer_only")),
        ),
        new_aliases={"enable-hierarchical-cache": ("enable-hicache",)},
    ),
}
