"""Search space: study-file params -> optuna distributions and sampled values. Pure.

Imports only `optuna.distributions` (pure data classes), never storage or samplers. Conditional
parameters (`when:`) are sampled only when their condition holds; otherwise they are absent from
the trial's params, so optuna's samplers treat them as inactive rather than as noise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Protocol

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.capacity.precheck import parallel_of
from tuner.config.objective import OLD_METRIC_NAMES
from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS, ParamSpec
from tuner.search.mode import search_mode
from tuner.sglang.defaults import launch_defaults
from tuner.sglang.flags import canonical_flag, normalize_flags

_OPS = {
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "ne": lambda a, b: a != b,
}


class Suggester(Protocol):
    """The part of `optuna.Trial` that sampling needs (a seam for tests)."""

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...
    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


def _suggest(trial: Suggester, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    assert isinstance(dist, FloatDistribution)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def distribution(spec: ParamSpec) -> BaseDistribution:
    """The optuna distribution of one parameter spec."""
    kind = spec.kind
    if kind == "bool":
        return CategoricalDistribution([False, True])
    if kind == "categorical":
        return CategoricalDistribution(list(spec.choices or []))
    assert spec.low is not None and spec.high is not None  # guaranteed by ParamSpec
    if kind == "int":
        step = int(spec.step or 1)
        high = int(spec.low) + (int(spec.high) - int(spec.low)) // step * step
        return IntDistribution(int(spec.low), high, log=spec.log, step=step)
    if spec.step:
        # optuna wants high - low to be a multiple of step; round away float noise (0.80..0.95 by 0.01)
        n = round((spec.high - spec.low) / spec.step)
        return FloatDistribution(spec.low, round(spec.low + n * spec.step, 10), step=spec.step)
    return FloatDistribution(spec.low, spec.high, log=spec.log)


def distributions(space: Mapping[str, ParamSpec]) -> dict[str, BaseDistribution]:
    return {name: distribution(spec) for name, spec in space.items()}


def condition_holds(when: Mapping[str, Any] | None, params: Mapping[str, Any]) -> bool:
    """Does `when:` hold for the params sampled so far? A missing (inactive) dependency fails."""
    for dep, cond in (when or {}).items():
        if dep not in params:
            return False
        value = params[dep]
        if isinstance(cond, Mapping):
            if not all(_OPS[op](value, ref) for op, ref in cond.items()):
                return False
        elif isinstance(cond, list):
            if value not in cond:
                return False
        elif value != cond:
            return False
    return True


def ordered(space: Mapping[str, ParamSpec]) -> list[str]:
    """Parameters with every `when:` dependency before its dependents (cycles are config errors)."""
    done: list[str] = []
    pending = dict(space)
    while pending:
        ready = [n for n, s in pending.items() if all(d in done for d in (s.when or {}))]
        if not ready:
            raise ValueError(f"space: circular `when:` between {', '.join(sorted(pending))}")
        for name in ready:
            done.append(name)
            del pending[name]
    return done


def sample(trial: Suggester, space: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """Ask the trial for every active parameter, in dependency order."""
    dists = distributions(space)
    params: dict[str, Any] = {}
    for name in ordered(space):
        if condition_holds(space[name].when, params):
            params[name] = _suggest(trial, name, dists[name])
    return params


def active_params(params: Mapping[str, Any], space: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """Drop parameters whose condition fails (e.g. a baseline that names an inactive one)."""
    out: dict[str, Any] = {}
    for name in ordered(space):
        if name in params and condition_holds(space[name].when, out):
            out[name] = params[name]
    return out


def server_flags(params: Mapping[str, Any]) -> dict[str, Any]:
    """The SGLang flags a trial's params ask for (client-side params removed).

    `hicache-size` is kept even at 0: merged over the fixed flags, `sglang.flags.effective_flags`
    turns it into HiCache on or off for the whole set (a fixed `enable-hierarchical-cache`
    included), as the launch, the pre-check and the export all read it.
    """
    return {k: v for k, v in params.items() if k not in CLIENT_PARAMS}


def sglang_defaults(cfg: StudyConfig, gpu_mem_mib: float | None) -> dict[str, Any]:
    """Trial 0 without a `baseline:`: SGLang's own default for every searched flag that has one
    inside the search space (the mfs SGLang would compute for this GPU; HiCache off)."""
    defaults = launch_defaults(gpu_mem_mib, parallel_of(cfg.server).tp)
    out = {}
    for name, dist in distributions(cfg.space).items():
        value = defaults.get(canonical_flag(name) or name)
        if value is not None and not isinstance(value, bool) and _inside(dist, value):
            out[name] = _snap(dist, value)
    return active_params(out, cfg.space)


def _inside(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    return isinstance(value, int | float) and dist.low <= value <= dist.high


def _snap(dist: BaseDistribution, value: Any) -> Any:
    """A value on the distribution's grid (optuna rejects an enqueued value off its step)."""
    step = getattr(dist, "step", None)
    if not step or isinstance(dist, CategoricalDistribution):
        return value
    snapped = dist.low + round((value - dist.low) / step) * step
    return int(snapped) if isinstance(dist, IntDistribution) else round(snapped, 10)


def client_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k in CLIENT_PARAMS}


def canonical(params: Mapping[str, Any]) -> str:
    """A stable key for a configuration: equal configs measured twice are answered once."""
    return json.dumps({k: _plain(v) for k, v in sorted(params.items())}, sort_keys=True)


def _plain(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 9)
    return v


def fingerprint(cfg: StudyConfig) -> dict[str, str]:
    """Hashes of what makes trial results comparable; resuming with any of them changed is refused."""
    # flags under SGLang's canonical names: `tp: 8` and `tensor-parallel-size: 8` are one study
    space = cfg.model_dump(include={"space"}, mode="json")
    for spec in space["space"].values():
        spec.pop("search", None)  # hashed below as the mode it means, so unset == its default
    parts = {
        "space": {"space": normalize_flags(space["space"])}
        # studies from before the inner search (joint, the only mode then) keep their hash
        | ({"concurrency": "inner"} if search_mode(cfg) == "inner" else {}),
        "server": normalize_flags(cfg.server),
        "workload": cfg.workload.model_dump(mode="json"),
        "objective": _objective_as_hashed(cfg),
        "target": _target_as_hashed(cfg),
    }
    return {name: _hash16(value) for name, value in parts.items()}


def hosted_target_hash(cfg: StudyConfig) -> str:
    """The target's hash as studies made before workers on several hosts stored it (the host
    included): such a study resumes, and its stored fingerprint is brought up to date."""
    return _hash16({"host": cfg.target.host, **_target_as_hashed(cfg)})


def _hash16(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _target_as_hashed(cfg: StudyConfig) -> dict[str, Any]:
    """How the server runs, not where: workers sharing a study each drive their own host (the
    identity check stops one whose GPU or SGLang differs). What was added later (the
    environment, the container's options) is hashed only when set, so a study made before
    keeps its hash; environment values may be secrets, so each is hashed on its own first (the
    fingerprint is stored)."""
    # a fleet's workers share the study: its file's own target: is hashed (config/fleet.py)
    target = cfg.fleet.base_target if cfg.fleet is not None else cfg.target
    out: dict[str, Any] = {"launch": target.launch, "gpus": target.gpus}
    if target.env:  # SGLANG_*, NCCL_*, ... change the server's behaviour
        out["env"] = {k: _digest(v) for k, v in sorted(target.env.items())}
    box = target.container
    if box is None:
        return out
    out["image"] = box.image  # another image is another SGLang
    defaults = type(box).model_fields
    for name in ("run_options", "mounts", "env"):
        value = getattr(box, name)
        if value != defaults[name].get_default(call_default_factory=True):
            out[f"container_{name}"] = value
    return out


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _objective_as_hashed(cfg: StudyConfig) -> dict[str, Any]:
    """The objective as fingerprints have always hashed it: a renamed metric under its old
    name, so a study written before the rename resumes (same meaning, same hash)."""
    objective = cfg.objective.model_dump(mode="json")
    old = {new: old for old, new in OLD_METRIC_NAMES.items()}
    objective["metric"] = old.get(objective["metric"], objective["metric"])
    return objective


def tidy(value: Any, dist: BaseDistribution | None = None) -> Any:
    """A sampled value as the user would write it: 0.87, not 0.8700000000000001.

    A float on a step grid is rounded to the grid's decimals (those of the step and of the low
    end: 0.805..0.905 by 0.01 keeps 3); any other float loses only binary noise (12 digits).
    """
    if not isinstance(value, float):
        return value
    step = getattr(dist, "step", None)
    if step and isinstance(dist, FloatDistribution):
        return round(value, max(_decimals(step), _decimals(dist.low)))
    return float(f"{value:.12g}")


def tidy_params(
    params: Mapping[str, Any], dists: Mapping[str, BaseDistribution] | None = None
) -> dict[str, Any]:
    """`tidy` over a trial's params (`dists`: the trial's own distributions, when known)."""
    dists = dists or {}
    return {k: tidy(v, dists.get(k)) for k, v in params.items()}


def _decimals(x: float) -> int:
    """Decimal places of a number as written: 0.01 -> 2, 0.5 -> 1, 10 -> 0."""
    exponent = Decimal(repr(float(x))).normalize().as_tuple().exponent
    return max(0, -int(exponent))
