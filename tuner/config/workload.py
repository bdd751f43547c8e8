"""The study file's `workload:` section: the traffic each trial is scored on (schema only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tuner.config.base import MAX_CONCURRENCY, MAX_DURATION_S, MAX_TOKENS, Model

#: warm-up requests run before each measurement, every trial: a few suffice
MAX_WARMUP = 1_000
#: key -> the kinds whose requests it shapes (tuner.loadgen.workload builds them; the inner search's
#: estimate also reads input_len of a dataset as its mean prompt). Given for another kind, a key
#: would be ignored: it is refused.
KINDS_OF_KEY = {
    "input_len": ("random", "multi-turn", "sharegpt", "jsonl"),
    # sharegpt's lengths are its replies' (or dataset_output_len); jsonl's records without
    # max_tokens take output_len
    "output_len": ("random", "shared-prefix", "multi-turn", "jsonl"),
    "length_dist": ("random", "multi-turn"),
    "lognormal_sigma": ("random", "multi-turn"),
    "num_groups": ("shared-prefix",),
    "prompts_per_group": ("shared-prefix",),
    "prefix_len": ("shared-prefix",),
    "question_len": ("shared-prefix", "multi-turn"),
    "turns": ("multi-turn",),
    "shuffle": ("shared-prefix", "sharegpt", "jsonl"),
    "dataset": ("sharegpt", "jsonl"),
    "dataset_output_len": ("sharegpt", "jsonl"),
    "range_ratio": ("random", "multi-turn"),
}


class WorkloadSection(Model):
    """The traffic each trial is scored on and how it is sent: the one source of these options'
    defaults and of their checks' wording. `tuner.loadgen.workload.requests_for` and
    `tuner.loadgen.load_options` build the I/O layer's types from it; `tuner bench` builds one
    from its flags (naming the flag instead of the key)."""

    kind: Literal["random", "shared-prefix", "multi-turn", "sharegpt", "jsonl"] = "random"
    backend: Literal["sglang", "openai", "openai-chat"] = "sglang"
    input_len: int = 1024
    output_len: int = 256
    range_ratio: float = 1.0  # lengths uniform in [max(L * ratio, 1), L]: 1 = exactly L
    length_dist: Literal["uniform", "fixed", "lognormal"] = "uniform"
    lognormal_sigma: float = 0.5  # lognormal lengths: median L, clipped to [1, 4 L]
    num_groups: int = 64  # shared-prefix: groups x prompts_per_group requests
    prompts_per_group: int = 16
    prefix_len: int = 2048
    question_len: int = 128
    turns: int = 4  # multi-turn: turns per conversation
    shuffle: bool = True  # interleave shared-prefix groups; sample dataset records at random
    dataset: str | None = Field(None, validate_default=True)
    dataset_output_len: int | None = None  # dataset records: this many output tokens each
    num_requests: int | None = None
    duration_s: float | None = 60
    warmup_requests: int = 1
    flush_cache: bool = True
    request_rate: float | None = None  # None = closed loop at the trial's concurrency
    request_timeout_s: float = 600
    max_error_rate: float = 0.05  # beyond it the run stops early, flagged
    stream: bool = True
    model: str | None = None  # OpenAI endpoints' model name; None = the first of /v1/models
    seed: int = 0
    #: the client's fixed concurrency when the study does not search it (space.concurrency);
    #: None with a request rate = no cap (bench_serving's max_concurrency None)
    concurrency: int | None = None

    # the checks are validators rather than Field(ge=...) so that their wording reads the same
    # after a key (study file) or a flag (`tuner bench`)
    @field_validator(
        "input_len",
        "output_len",
        "num_groups",
        "prompts_per_group",
        "question_len",
        "turns",
        "num_requests",
        "dataset_output_len",
    )
    @classmethod
    def _at_least_one(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"must be >= 1 (got {v})")
        if v is not None and info.field_name.endswith("_len") and v > MAX_TOKENS:
            # the whole request list is built in memory up front: lengths are bounded
            raise ValueError(f"must be at most {MAX_TOKENS:,} tokens (got {v:,})")
        return v

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_CONCURRENCY:
            raise ValueError(f"must be in 1..{MAX_CONCURRENCY:,} (got {v})")
        return v

    @field_validator("prefix_len", "warmup_requests")
    @classmethod
    def _not_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be >= 0 (got {v})")
        if v > MAX_TOKENS:
            raise ValueError(f"must be at most {MAX_TOKENS:,} (got {v:,})")
        return v

    @field_validator("lognormal_sigma", "duration_s", "request_rate", "request_timeout_s")
    @classmethod
    def _positive(cls, v: float | None, info: Any) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"must be > 0 (got {v:g})")
        if v is not None and info.field_name.endswith("_s") and v > MAX_DURATION_S:
            raise ValueError(f"must be at most {MAX_DURATION_S:g} s (7 days) (got {v:g})")
        return v

    @field_validator("lognormal_sigma")
    @classmethod
    def _sigma(cls, v: float) -> float:
        # lengths are clipped to [1, 4 L] anyway: a sigma above 4 only overflows exp()
        if v > 4:
            raise ValueError(f"must be at most 4 (got {v:g})")
        return v

    @field_validator("warmup_requests")
    @classmethod
    def _warmup(cls, v: int) -> int:
        if v > MAX_WARMUP:
            raise ValueError(f"must be at most {MAX_WARMUP:,} (got {v:,}): it only warms up")
        return v

    @field_validator("range_ratio", "max_error_rate")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 <= v <= 1:
            raise ValueError(f"must be in [0, 1] (got {v:g})")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str | None, info: Any) -> str | None:
        # `info` is pydantic's ValidationInfo: the fields validated so far (kind comes first)
        kind = info.data.get("kind")
        if kind in ("sharegpt", "jsonl") and not v:
            raise ValueError(f"a {kind} workload needs a dataset file")
        return v

    def ignored_key(self, given: set[str] | None = None) -> tuple[str, str] | None:
        """(key, why) for the first key given explicitly (`given`: these keys only, e.g. the
        flags `tuner bench` was typed with) that this workload would ignore, or None. Not a
        validator: `tuner bench` and tests build sections with every key; a study file's
        section is checked with it (config.StudyConfig)."""
        keys = self.model_fields_set if given is None else self.model_fields_set & given
        for key, kinds in KINDS_OF_KEY.items():
            if key not in keys or getattr(self, key) is None:
                continue
            if self.kind not in kinds:
                takes = " or ".join([", ".join(kinds[:-1]), kinds[-1]] if kinds[1:] else kinds)
                kind = self.kind if "kind" in self.model_fields_set else f"{self.kind} (default)"
                return key, (
                    f"kind {kind} ignores {key}, which applies to kind {takes}: "
                    "drop it or set kind"
                    + (" (its prompts are prefix_len + question_len)" if key == "input_len" else "")
                )
        if "lognormal_sigma" in keys and self.length_dist != "lognormal":
            return "lognormal_sigma", (
                f"applies to length_dist: lognormal only (length_dist is {self.length_dist}): "
                "drop it or set length_dist"
            )
        if "range_ratio" in keys and self.length_dist != "uniform":
            return "range_ratio", (
                f"applies to length_dist: uniform only (length_dist is {self.length_dist}): "
                "drop it or set length_dist"
            )
        if "model" in keys and self.model is not None and self.backend == "sglang":
            return "model", (
                "backend sglang (/generate) sends no model name: it applies to backend openai "
                "or openai-chat; drop it or set backend"
            )
        return None

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSection:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give duration_s, num_requests or both")
        return self
