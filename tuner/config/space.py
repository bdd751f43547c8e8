"""The study file's `space:` section: one searched parameter (a range or a list of choices, with an
optional `when:`), and which parameters are the client's rather than the server's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tuner.config.base import MAX_STEPS, Model, bool_choices

#: search-space keys that are the client's, not the server's: changing them needs no restart
CLIENT_PARAMS = frozenset({"concurrency", "request-rate"})


Scalar = str | int | float | bool


FlagValue = Scalar | list[Scalar]


Comparison = Literal["gt", "ge", "lt", "le", "ne"]


class ParamSpec(Model):
    """One searched parameter: a range (float or int, optional step, log) or a list of choices."""

    type: Literal["float", "int", "categorical", "bool"] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = Field(None, gt=0)
    log: bool = False
    choices: list[Scalar] | None = None
    #: only sampled when every named parameter matches: a value, a list of values, or a
    #: comparison such as {gt: 0}
    when: dict[str, Scalar | list[Scalar] | dict[Comparison, float]] | None = None
    search: Literal["inner", "joint"] | None = None  # concurrency only: see tuner/trial/inner.py

    @model_validator(mode="before")
    @classmethod
    def _bool_choices(cls, data: Any) -> Any:
        """`{type: bool, choices: [...]}` samples those choices: true and/or false. One of them
        alone is a list of one choice (categorical), so the space samples only it."""
        return bool_choices(data)

    @model_validator(mode="after")
    def _shape(self) -> ParamSpec:
        kind = self.kind
        if kind in ("categorical", "bool"):
            if self.low is not None or self.high is not None:
                raise ValueError(f"a {kind} parameter takes choices, not low/high")
            if self.step is not None or self.log:
                raise ValueError("step and log apply to a range (low/high), not to choices")
            if kind == "categorical" and not self.choices:
                raise ValueError("choices: expected a non-empty list")
            return self
        if self.choices is not None and self.type in ("int", "float"):
            raise ValueError(
                f"type {self.type} takes low and high, not choices: drop type (a list of "
                "choices is categorical) or give low and high"
            )
        if self.low is None or self.high is None:
            raise ValueError(
                "expected high as well as low"
                if self.low is not None
                else "expected low as well as high"
                if self.high is not None
                else "expected low and high (or choices)"
            )
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, got {self.low:g}")
        if self.log and self.step is not None and kind == "float":
            raise ValueError("step and log cannot be combined for a float (optuna's rule)")
        if self.log and self.step is not None and self.step != 1 and kind == "int":
            # optuna refuses it only when the study samples, after the study is created
            raise ValueError(
                f"step ({self.step:g}) and log cannot be combined for an int: a log range "
                "takes step 1 (optuna's rule); drop step or log"
            )
        if self.step is not None and (self.high - self.low) / self.step > MAX_STEPS:
            raise ValueError(
                f"step {self.step:g} makes more than {MAX_STEPS:,} points from low to high"
            )
        if self.choices is not None:
            raise ValueError("a range takes low/high, not choices")
        if kind == "int":
            for name in ("low", "high", "step"):
                value = getattr(self, name)
                if value is not None and value != int(value):
                    raise ValueError(
                        f"{name} ({value:g}) must be a whole number for an int parameter"
                    )
        return self

    @property
    def kind(self) -> str:
        """The parameter's type, inferred when not given: choices -> categorical, ints -> int."""
        if self.type:
            return self.type
        if self.choices is not None:
            return "categorical"
        bounds = [v for v in (self.low, self.high, self.step) if v is not None]
        integer = bounds and all(float(v).is_integer() for v in bounds) and self.step != 0
        return "int" if integer else "float"
