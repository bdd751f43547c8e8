"""The defaults SGLang computes from the GPU's memory (server_args.py, 0.5.3 and later). Pure.

`gpu_mem_mib` is the smallest GPU's `nvidia-smi --query-gpu=memory.total`, in MiB, as SGLang
reads it (sglang-reference.md section 1, "Default mem-fraction-static").
"""

from __future__ import annotations

from typing import Any

from tuner.sglang.flags import DEFAULT_VERSION, defaults


def default_chunked_prefill_and_graph_bs(gpu_mem_mib: float, tp: int = 1) -> tuple[int, int]:
    """`(chunked_prefill_size, cuda_graph_max_bs)` SGLang picks for this GPU size and TP."""
    small_tp = tp < 4
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        return 2048, 24 if small_tp else 80
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if gpu_mem_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def default_mem_fraction_static(
    gpu_mem_mib: float,
    tp: int = 1,
    pp: int = 1,
    chunked_prefill_size: int | None = None,
    cuda_graph_max_bs: int | None = None,
) -> float:
    """SGLang's (>= 0.5.3) default `--mem-fraction-static` for the smallest GPU's memory."""
    d_chunk, d_bs = default_chunked_prefill_and_graph_bs(gpu_mem_mib, tp)
    chunk = d_chunk if chunked_prefill_size is None else chunked_prefill_size
    bs = d_bs if cuda_graph_max_bs is None else cuda_graph_max_bs
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def launch_defaults(
    gpu_mem_mib: float | None, tp: int = 1, version: str = DEFAULT_VERSION
) -> dict[str, Any]:
    """SGLang's default for every flag of that version, by canonical name.

    With the GPU's memory (MiB), `mem-fraction-static`, `chunked-prefill-size` and, where the
    version has it, `cuda-graph-max-bs` are what SGLang would compute for that GPU and TP; without
    it (None or 0) they stay None, as in SGLang's table. 0.5.23 splits the graph batch size into
    decode/prefill flags whose computed defaults the reference does not give: they stay None.
    """
    out = defaults(version)
    if gpu_mem_mib:
        out["mem-fraction-static"] = default_mem_fraction_static(gpu_mem_mib, tp)
        chunk, graph_bs = default_chunked_prefill_and_graph_bs(gpu_mem_mib, tp)
        out["chunked-prefill-size"] = chunk
        if "cuda-graph-max-bs" in out:
            out["cuda-graph-max-bs"] = graph_bs
    return out
