"""What the study asks of the host at the far end of its space: the largest TP, DP, PP and
HiCache size any trial may use, the mfs range, the model path and any draft model's. Pure.

A flag may be fixed under `server:` or searched under `space:` (by any of SGLang's names for
it); the largest value a trial can get is what the host must hold.
"""

from __future__ import annotations

from typing import Any

from tuner.capacity.calculus import Parallel
from tuner.config.schema import StudyConfig
from tuner.sglang.flags import full_name

#: SGLang's flag for a separate draft model (its alias `--speculative-draft-model`)
DRAFT_PATH = "speculative-draft-model-path"


def _numbers(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def values_of(cfg: StudyConfig, flag: str) -> tuple[str | None, list[float]]:
    """(where the study sets `flag`, the values a trial can get: a fixed value, or the ends
    of a range, or the choices); (None, []) when the study leaves it to SGLang."""
    for name, value in cfg.server.items():
        if full_name(name) == flag:
            return f"server.{name}", _numbers(value if isinstance(value, list) else [value])
    for name, spec in cfg.space.items():
        if full_name(name) == flag:
            if spec.choices is not None:
                return f"space.{name}", _numbers(list(spec.choices))
            return f"space.{name}", _numbers([spec.low, spec.high])
    return None, []


def largest(cfg: StudyConfig, flag: str, default: float) -> float:
    """The largest value of `flag` any trial can get (`default`: SGLang's, when unset)."""
    return max(values_of(cfg, flag)[1], default=default)


def always_on(cfg: StudyConfig, flag: str) -> bool:
    """Is the switch `flag` on in every trial (fixed true, or searched with true alone)?"""
    for name, value in cfg.server.items():
        if full_name(name) == flag:
            return value is True
    for name, spec in cfg.space.items():
        if full_name(name) == flag:
            return spec.choices is not None and list(spec.choices) == [True]
    return False


def largest_parallel(cfg: StudyConfig) -> Parallel:
    """The largest split a trial can ask for: the largest TP, DP and PP, and DP attention only
    where every trial has it (without it, DP counts replicas: more GPU ranks on the host);
    0.5.23's `--attn-dp-size` is DP attention in every trial that sets it above 1."""
    attn_dp = values_of(cfg, "attn-dp-size")[1]
    if attn_dp and min(attn_dp) > 1:
        return Parallel(
            tp=int(largest(cfg, "tensor-parallel-size", 1)),
            dp=int(max(attn_dp)),
            pp=int(largest(cfg, "pipeline-parallel-size", 1)),
            dp_attention=True,
        )
    return Parallel(
        tp=int(largest(cfg, "tensor-parallel-size", 1)),
        dp=int(largest(cfg, "data-parallel-size", 1)),
        pp=int(largest(cfg, "pipeline-parallel-size", 1)),
        dp_attention=always_on(cfg, "enable-dp-attention"),
    )


def draft_paths(cfg: StudyConfig) -> tuple[str | None, list[str]]:
    """(where the study sets `--speculative-draft-model-path`, the paths a trial can get:
    fixed, or the string choices searched); (None, []) when it sets none."""
    for name, value in cfg.server.items():
        if full_name(name) == DRAFT_PATH and isinstance(value, str) and value:
            return f"server.{name}", [value]
    for name, spec in cfg.space.items():
        if full_name(name) == DRAFT_PATH and spec.choices:
            paths = [c for c in spec.choices if isinstance(c, str) and c]
            if paths:
                return f"space.{name}", paths
    return None, []


def model_path(cfg: StudyConfig) -> str | None:
    """`server.model-path` (or its alias), as given."""
    for name, value in cfg.server.items():
        if full_name(name) == "model-path" and isinstance(value, str):
            return value
    return None
