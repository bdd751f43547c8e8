"""SGLang's start-up and batch log lines, in the format of the version played. Pure.

0.5.23 changed several templates (tests/fidelity/test_loglines_fidelity.py names the lines):
`Load weight end.` leads with `elapsed=` and drops `dtype=`; the KV pool line adds `dtype:`; CUDA
graphs are captured as "target decode CUDA graph" with the backend and the batch sizes; the prefill
line adds `#pending-token`, the graph flag and the input throughput; the decode line loses its
trailing comma.
"""

from __future__ import annotations

from tuner.sim.http.oaishapes import newer

#: SGLang's torch dtype of the KV cache per `--kv-cache-dtype` (auto: the model's dtype)
KV_TORCH_DTYPE = {
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
    "bf16": "torch.bfloat16",
    "bfloat16": "torch.bfloat16",
    "fp4_e2m1": "torch.float4_e2m1fn_x2",
}


def load_weight_end(
    version: str, elapsed: float, arch: str, dtype: str, avail: float, usage: float
) -> str:
    """`Load weight end.` (model_runner.py)."""
    if newer(version):
        return (
            f"Load weight end. elapsed={elapsed:.2f} s, type={arch}, "
            f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB."
        )
    return (
        f"Load weight end. type={arch}, dtype={dtype}, "
        f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB."
    )


def kv_allocated(version: str, dtype: str, tokens: int, mla: bool, kv_gib: float) -> str:
    """`KV Cache is allocated.` (memory_pool.py): one `KV size` for MLA, else K and V halves."""
    head = "KV Cache is allocated. "
    if newer(version):
        head += f"dtype: {dtype}, "
    head += f"#tokens: {tokens}"
    if mla:
        return f"{head}, KV size: {kv_gib:.2f} GB"
    return f"{head}, K size: {kv_gib / 2:.2f} GB, V size: {kv_gib / 2:.2f} GB"


def capture_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang 0.5.23 captures (arg_groups/cuda_graph_hook.py)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def graph_begin(version: str, avail: float, tokens_per_req: int = 1) -> str:
    """The line before CUDA graph capture (`tokens_per_req`: the draft tokens a speculative
    verify step runs per request)."""
    if newer(version):
        return (
            "Capture target decode CUDA graph begin. backend=full, "
            f"num_tokens_per_req={tokens_per_req}, avail mem={avail:.2f} GB"
        )
    return (
        f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB"
    )


def graph_end(version: str, max_bs: int, elapsed: float, usage: float, avail: float) -> str:
    """The line after CUDA graph capture."""
    if newer(version):
        return (
            f"Capture target decode CUDA graph end. bs={capture_sizes(max_bs)}, "
            f"elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={avail:.2f} GB."
        )
    return (
        f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. "
        f"mem usage={usage:.2f} GB. avail mem={avail:.2f} GB."
    )


#: 0.5.23's advice after a failed capture (model_executor/runner_backend_utils/__init__.py)
GRAPH_ADVICE_0_5_23 = (
    "Possible solutions:",
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)",
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose",
)


def graph_advice(version: str, older: tuple[str, ...]) -> tuple[str, ...]:
    """The advice lines after `Capture cuda graph failed` (`older`: 0.5.6.post2's)."""
    return GRAPH_ADVICE_0_5_23 if newer(version) else older
