"""Study file -> validated, immutable `StudyConfig`. Every error names the file and the key path.

Conventions of the study file: tuner's own keys are snake_case; SGLang flags (under `server:`,
`space:` and `baseline:`) keep SGLang's dashed names, exactly as SGLang's `--config` YAML takes
them, so the exported launch config is `server` plus the winning `space` values.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.config.base import (
    MAX_TRIALS,
    Duration,
    DurationOrOff,
    Model,
    got,
    hicache_problem,
    merge_union,
    number_problem,
    parse_duration,
    port_problem,
    user_loc,
)
from tuner.config.fleet import KEY as FLEET_KEY
from tuner.config.fleet import Fleet, parse_fleet
from tuner.config.objective import ObjectiveSection
from tuner.config.space import FlagValue, ParamSpec
from tuner.config.target import TargetSection
from tuner.config.workload import WorkloadSection
from tuner.config.yamlfile import special_file
from tuner.errors import ConfigError

FLAG_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class BudgetSection(Model):
    """How much to spend: trials count across resumes; timeout is per `tuner tune` run."""

    n_trials: int = Field(20, ge=1, le=MAX_TRIALS)
    timeout: Duration | None = None  # wall clock for one `tuner tune` run: 8h, 90m, 3600
    trial_timeout: Duration = 3600  # one trial end to end (restart + load)
    confirm_top: int = Field(3, ge=0, le=100)
    confirm_repeats: int = Field(2, ge=1, le=20)  # each is a restart and a load run
    confirm_extra: int = Field(2, ge=0, le=10)  # rounds re-running winner and runner-up in noise
    #: rounds after those, run only while the winner is shaky (a start that missed, or odds of
    #: holding its limits below steady) and --timeout leaves time: it and the next candidate
    confirm_shaky: int = Field(3, ge=0, le=10)
    infra_retries: int = Field(2, ge=0, le=20)
    #: this many trials in a row failing for the world's reasons stop the study (exit 1)
    max_consecutive_infra_failures: int = Field(3, ge=1, le=100)
    #: once a server of the run started, world failures are ridden out this long (a reboot, an
    #: sshd restart), pausing between trials, before those failures stop the study; 0: never
    outage_tolerance: DurationOrOff = 900.0
    #: after a new server measures, try this many neighbouring concurrencies on it (no restart):
    #: up by 1.5x while the SLOs hold, down by 1.5x when they are missed
    concurrency_probes: int = Field(1, ge=0, le=4)
    inner_runs: int = Field(5, ge=1, le=20)  # load runs per server in the inner search
    #: end a load run early once it clearly cannot beat the best point known, and record it
    #: as cut, never as a measured score (tuner/search/cut.py); confirmation drops a candidate
    #: that trails a steady winner beyond the noise (study/confirm.py); false: neither
    early_stop: bool = True

    @field_validator("timeout", "trial_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)


class SamplerSection(Model):
    name: Literal["tpe", "gp", "random", "grid", "qmc"] = "tpe"
    seed: int = Field(0, ge=0, le=2**32 - 1)  # numpy's seed range (optuna's samplers use it)
    #: random trials before TPE models: 4, measured (bench_search, inner search on): at 10
    #: restarts the Kimi case's median rose .898 -> .945 against 8, the others moved < 0.01
    n_startup_trials: int = Field(4, ge=0, le=MAX_TRIALS)
    #: grid: points taken on a range without a step (on the log scale for `log: true`)
    grid_points: int = Field(8, ge=2, le=1000)
    #: queue the best server's mfs raised halfway to the nearest failure above it (search/edge.py)
    mfs_edge: bool = True


class HardwareSection(Model):
    """Facts for the pre-check that rejects certainly-infeasible configs without a restart."""

    model_config_path: str | None = Field(None, alias="model_config")  # path or shipped name
    # bounds far above any machine (16 TiB per GPU, 1 PB of RAM) keep the arithmetic finite
    gpu_mem_mib: float | None = Field(None, gt=0, le=16 << 20)
    host_ram_gb: float | None = Field(None, gt=0, le=1e6)
    weights_gib: float | None = Field(None, ge=0, le=1e6)

    @field_validator("model_config_path")
    @classmethod
    def _readable(cls, v: str | None) -> str | None:
        # a FIFO or a device here would hang or exhaust memory when the config is read
        path = Path(v).expanduser() if v else None
        for p in (path, path / "config.json") if path and path.is_dir() else (path,):
            if p is not None and (problem := special_file(p)):
                raise ValueError(f"{p}: {problem}")
        return v


class StudyConfig(Model):
    """A whole study file."""

    study: str
    description: str = ""
    target: TargetSection = TargetSection()
    server: dict[str, FlagValue]
    space: dict[str, ParamSpec]
    baseline: dict[str, FlagValue] | None = None
    workload: WorkloadSection = WorkloadSection()
    objective: ObjectiveSection = ObjectiveSection()
    budget: BudgetSection = BudgetSection()
    sampler: SamplerSection = SamplerSection()
    hardware: HardwareSection = HardwareSection()
    storage: str | None = Field(None, min_length=1)  # an optuna storage URL; None = SQLite
    notify: NotifySection | None = None  # not in the fingerprint: it changes no measurement
    source: str = Field("", exclude=True)  # the file it came from (not part of the fingerprint)
    #: `fleet:` (config/fleet.py), set by parse_schema after the rest validates
    fleet: Fleet | None = Field(None, exclude=True)

    @field_validator("study")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", v):
            raise ValueError(
                "expected a name of letters, digits, '.', '_' or '-' (it names runs/<study>/)"
            )
        return v

    @field_validator("server", "baseline", mode="before")
    @classmethod
    def _values(cls, v: Any) -> Any:
        # before pydantic's union, whose wording ("a valid string") misleads for a flag value
        for key, value in v.items() if isinstance(v, dict) else ():
            for item in value if isinstance(value, list) else [value]:
                if item is None or isinstance(item, dict | list):
                    raise ValueError(
                        f"{key}: expected a value or a list of values (got {item!r}); "
                        "drop the key to use SGLang's default"
                    )
                if isinstance(item, float) and not math.isfinite(item):
                    raise ValueError(f"{key}: expected a finite number (got {item})")
        return v

    @field_validator("server", "baseline")
    @classmethod
    def _flags(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in v or {}:
            _check_flag_name(key)
        return v

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, ParamSpec]) -> dict[str, ParamSpec]:
        if not v:
            raise ValueError("expected at least one parameter to search")
        for key in v:
            _check_flag_name(key)
        return v

    @model_validator(mode="after")
    def _cross(self) -> StudyConfig:
        if "model-path" not in self.server and "model" not in self.server:
            raise ValueError("server: model-path is required (the model SGLang serves)")
        for name in ("model-path", "model"):
            value = self.server.get(name)
            if name in self.server and not (isinstance(value, str) and value.strip()):
                raise ValueError(
                    f"server: {name}: expected the model's path or Hugging Face id "
                    f"(got {_brief(value)})"
                )
        if found := self.workload.ignored_key():
            raise ValueError(f"workload: {found[0]}: {found[1]}")
        if self.workload.request_rate is not None and "request-rate" in self.space:
            raise ValueError(
                "workload: request_rate: is also searched under space.request-rate: "
                "keep it in one place"
            )
        for name, spec in self.space.items():
            if name in self.server:
                raise ValueError(
                    f"server: {name}: is also searched under space: keep it in one place"
                )
            for dep, cond in (spec.when or {}).items():
                if dep not in self.space:
                    raise ValueError(f"space: {name}.when: {dep} is not a searched parameter")
                if problem := _condition_problem(cond, self.space[dep]):
                    raise ValueError(f"space: {name}.when.{dep}: {problem}")
        for name in self.baseline or {}:
            if name not in self.space:
                raise ValueError(f"baseline: {name} is not a searched parameter")
        _one_name_per_flag(self.server, self.space)
        if problem := hicache_problem(self.server) or port_problem(self, self.target.port):
            raise ValueError(problem)
        window_ms = (self.workload.duration_s or 0) * 1000
        for limit in ("p99_ttft_ms", "p99_e2e_latency_ms"):
            value = getattr(self.objective.slo, limit)
            if value is not None and window_ms and value >= window_ms:
                # a run cut at duration_s never observes a wait longer than duration_s
                raise ValueError(
                    f"objective: slo.{limit} ({value:g}) must be below workload.duration_s "
                    f"({window_ms:g} ms): a longer wait cannot be observed in the run"
                )
        return self


def _condition_problem(cond: Any, dep: ParamSpec) -> str | None:
    """Why a `when:` condition can never hold for the values `dep` takes (None if it can)."""
    kind = dep.kind
    if isinstance(cond, dict):
        if kind in ("categorical", "bool") and not all(
            isinstance(c, int | float) and not isinstance(c, bool) for c in dep.choices or []
        ):
            return "a comparison needs a numeric parameter"
        return None
    values = cond if isinstance(cond, list) else [cond]
    if kind == "bool":
        possible = [False, True]
    elif kind == "categorical":
        possible = list(dep.choices or [])
    else:
        assert dep.low is not None and dep.high is not None  # a range
        bad = [
            v
            for v in values
            if isinstance(v, bool) or not isinstance(v, int | float) or not dep.low <= v <= dep.high
        ]
        return f"{bad[0]!r} is outside [{dep.low:g}, {dep.high:g}]" if bad else None
    bad = [v for v in values if not any(v == p and type(v) is type(p) for p in possible)]
    return f"{bad[0]!r} is not one of {possible}" if bad else None


def _one_name_per_flag(server: dict[str, Any], space: dict[str, Any]) -> None:
    """SGLang reads `tp` and `tensor-parallel-size` as one flag: refuse it under two names."""
    from tuner.sglang.flags import DuplicateFlagError, normalize_flags

    for section, flags in (("server", server), ("space", {**server, **space})):
        try:
            normalize_flags(flags)
        except DuplicateFlagError as exc:
            raise ValueError(f"{section}: {exc.detail}") from None


def _check_flag_name(key: str) -> None:
    if "_" in key:
        raise ValueError(f"{key}: use SGLang's dashed flag name {key.replace('_', '-')!r}")
    if key.startswith("-") or not FLAG_RE.match(key):
        raise ValueError(
            f"{key!r}: expected a flag name without dashes in front, e.g. mem-fraction-static"
        )


def _brief(value: Any) -> str:
    """repr, bounded: a YAML alias bomb is 10**9 items by reference, and repr walks them all."""
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother = 2, 80, 80
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 4
    text = r.repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _render(err: dict[str, Any]) -> tuple[str, str]:
    """One pydantic error -> (key path, message) in the study file's own words."""
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "tagged-union"))]
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    elif "input" in err and err["type"].endswith(("_type", "_parsing", "finite_number")):
        msg = f"{msg} {got(err['input'], _brief(err['input']))}"
    # cross-section messages name their own key ("space: x ...") when raised at the top level
    if not loc and ": " in msg and msg.split(": ", 1)[0] in StudyConfig.model_fields:
        section, msg = msg.split(": ", 1)
        loc = [section]
    flag = re.match(r"^([a-z][a-z0-9_-]*(?:\.[a-z_][a-z0-9_-]*)*): (.*)$", msg)
    if loc in (["server"], ["space"], ["baseline"], ["workload"]) and flag:
        # a flag's own message ("hicache-size: ...") names it as part of the key path
        return f"{loc[0]}.{flag.group(1)}", flag.group(2)
    return ".".join(loc), msg


def parse_schema(data: Any, source: str = "<study>") -> StudyConfig:
    """Validate an already-parsed mapping against the schema; raise ConfigError naming the
    first bad key. `config.load.parse_study` adds the checks against SGLang and the model."""
    if not isinstance(data, dict):
        raise ConfigError(
            "expected a mapping at the top level (study:, server:, space:, ...)", file=source
        )
    if found := number_problem(data):
        path, msg = found
        raise ConfigError(msg, file=source, key=".".join(path) or None)
    if FLEET_KEY in data:  # each worker's target judged as the study's would be
        cfg = parse_schema({k: v for k, v in data.items() if k != FLEET_KEY}, source)
        fleet = parse_fleet(data[FLEET_KEY], data, source, lambda d: parse_schema(d, source))
        return cfg.model_copy(update={"fleet": fleet})
    try:
        return StudyConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        # one problem per place in the file: a union's branches each report the same value
        places: dict[tuple[str, ...], list[Any]] = {}
        for err in exc.errors():
            places.setdefault(tuple(user_loc(err["loc"], data)), []).append(err)
        loc, errors = next(iter(places.items()))
        key, msg = _render({**merge_union(errors), "loc": loc})
        extra = len(places) - 1
        if extra:
            msg += f" (and {extra} more problem{'s' if extra > 1 else ''})"
        raise ConfigError(msg, file=source, key=key or None) from None


#: how long a notify command may run when neither the flag nor the file says
DEFAULT_TIMEOUT_S = 30.0


class NotifySection(BaseModel):
    """`notify:` in the study file (strict like the rest of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    command: str
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=3600)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("expected a shell command, e.g. 'cat > /tmp/tuner-summary.json'")
        return v
