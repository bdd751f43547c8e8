"""tuner.sglang.defaults: what SGLang computes from the GPU's memory, and a launch's defaults."""

from __future__ import annotations

import pytest

from tuner.sglang.defaults import (
    default_chunked_prefill_and_graph_bs,
    default_mem_fraction_static,
    launch_defaults,
)
from tuner.sglang.flags import defaults, flags_for

H100 = 81_559  # MiB, as nvidia-smi reports an H100-80G
H200 = 143_771


@pytest.mark.parametrize(
    ("gpu_mib", "tp", "expected"),
    [(H100, 1, 0.835), (H100, 8, 0.818), (H200, 1, 0.907), (H200, 8, 0.897)],
)
def test_mfs_matches_sglangs_examples(gpu_mib: int, tp: int, expected: float) -> None:
    assert default_mem_fraction_static(gpu_mib, tp) == expected


@pytest.mark.parametrize(
    ("gpu_gib", "tp", "expected"),
    [
        (16, 1, (2048, 8)),
        (24, 1, (2048, 24)),
        (24, 4, (2048, 80)),
        (48, 2, (4096, 32)),
        (48, 8, (4096, 160)),
        (80, 1, (8192, 256)),
        (80, 4, (8192, 512)),
        (192, 1, (16384, 512)),
    ],
)
def test_chunk_and_graph_bs_by_gpu_size(gpu_gib: int, tp: int, expected: tuple[int, int]) -> None:
    assert default_chunked_prefill_and_graph_bs(gpu_gib * 1024 - 1, tp) == expected


def test_launch_defaults_for_an_h100() -> None:
    d = launch_defaults(H100, tp=1)
    assert d["mem-fraction-static"] == 0.835
    assert d["chunked-prefill-size"] == 8192 and d["cuda-graph-max-bs"] == 256
    assert d["hicache-size"] == 0 and d["schedule-policy"] == "fcfs"
    assert set(d) == set(flags_for())
    assert launch_defaults(H100, tp=8)["mem-fraction-static"] == 0.818


@pytest.mark.parametrize("gpu", [None, 0])
def test_without_a_gpu_the_table_defaults_stay(gpu: float | None) -> None:
    assert launch_defaults(gpu) == defaults()


def test_the_new_version_has_no_single_graph_batch_size() -> None:
    d = launch_defaults(H100, version="0.5.23")
    assert "cuda-graph-max-bs" not in d
    assert d["mem-fraction-static"] == 0.835 and d["chunked-prefill-size"] == 8192
    assert d["cuda-graph-max-bs-decode"] is None
