"""Hardware + model scenarios for the simulator: `load_profile(name_or_path) -> Profile`.

A profile is a flat YAML mapping in `tuner/sim/profiles/<name>.yaml`. SIM-SERVER owns every key
but `timing:`, which is SIM-ENGINE's (parsed by `engine.StepTimeModel.from_mapping`). Unknown
keys are rejected so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError, InputFileError
from tuner.sim.levers import DPAttentionCosts, DraftProfile, parse_dp_attention, parse_speculative

PROFILES_DIR = Path(__file__).parent / "profiles"
#: the profile `--sim-profile` defaults to (the demo's)
DEFAULT_PROFILE = "llama-3.1-8b-h100"
MODEL_CONFIGS_DIR = Path(__file__).parent.parent / "model_configs"


@dataclass(frozen=True)
class GraphMemory:
    """GPU memory outside the KV pool that grows with launch flags (MiB).

    CUDA graphs: `graph_base_mib + graph_mib_per_bs * cuda_graph_max_bs`.
    Activations of one prefill batch: `activation_base_mib + activation_mib_per_token * tokens`.
    """

    graph_base_mib: float
    graph_mib_per_bs: float
    activation_base_mib: float
    activation_mib_per_token: float

    def graph_mib(self, cuda_graph_max_bs: int) -> float:
        """Memory CUDA-graph capture takes for batch sizes up to `cuda_graph_max_bs`."""
        return self.graph_base_mib + self.graph_mib_per_bs * max(cuda_graph_max_bs, 0)

    def activation_mib(self, prefill_tokens: int) -> float:
        """Peak activation memory of a prefill batch with `prefill_tokens` new tokens."""
        return self.activation_base_mib + self.activation_mib_per_token * max(prefill_tokens, 0)


@dataclass(frozen=True)
class Profile:
    """One simulated deployment: GPUs, host, model, and the step-time coefficients."""

    name: str
    gpu_name: str
    gpu_mem_mib: float  # total per GPU, as nvidia-smi reports it
    cuda_context_mib: float  # taken by CUDA/NCCL init before SGLang measures free memory
    hbm_gbps: float
    pcie_gbps: float
    tflops: float
    tp: int  # the TP the weights figure is for; other --tp-size values rescale it
    host_ram_gb: float
    host_used_gb: float
    model_path: str
    served_model_name: str
    architecture: str
    model_config: Mapping[str, Any]
    weights_gib_per_gpu: float
    other_gib: float  # buffers allocated before KV profiling
    active_params_b: float
    graph_memory: GraphMemory
    startup_s: float  # what a real start-up takes on this hardware (documentation, pre-check)
    version: str = "0.5.6.post2"
    timing: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the file it came from
    speculative: DraftProfile | None = None  # the draft it has (sim/levers.py), if any
    dp_attention: DPAttentionCosts | None = None  # what DP attention costs (sim/levers.py)

    @property
    def free_at_init_mib(self) -> float:
        """Free memory SGLang sees before loading weights."""
        return self.gpu_mem_mib - self.cuda_context_mib

    @property
    def host_available_gb(self) -> float:
        """Host RAM psutil would call available (decimal GB)."""
        return self.host_ram_gb - self.host_used_gb

    def weights_gib(self, tp: int) -> float:
        """Weights per GPU at another TP degree (the model is split evenly)."""
        return self.weights_gib_per_gpu * self.tp / max(tp, 1)

    def context_len(self) -> int:
        """The model's context length from its config (text_config for VL models)."""
        cfg = self.model_config
        inner = cfg.get("text_config")
        if isinstance(inner, Mapping) and "max_position_embeddings" in inner:
            cfg = inner
        return int(cfg.get("max_position_embeddings", 131072))

    def model_dtype(self) -> str:
        """The model's dtype name, as torch prints it (`torch.bfloat16`)."""
        cfg = self.model_config
        inner = cfg.get("text_config")
        dtype = (inner or {}).get("torch_dtype") if isinstance(inner, Mapping) else None
        return f"torch.{dtype or cfg.get('torch_dtype') or 'bfloat16'}"


_NUMBER_KEYS = {
    "gpu_mem_mib",
    "cuda_context_mib",
    "hbm_gbps",
    "pcie_gbps",
    "tflops",
    "host_ram_gb",
    "host_used_gb",
    "weights_gib_per_gpu",
    "other_gib",
    "active_params_b",
    "startup_s",
}
_STR_KEYS = {"name", "gpu_name", "model_path", "served_model_name", "architecture", "version"}
_GRAPH_KEYS = {f.name for f in fields(GraphMemory)}
_OPTIONAL_KEYS = {"version", "timing", "speculative", "dp_attention"}
_ALL_KEYS = _NUMBER_KEYS | _STR_KEYS | _OPTIONAL_KEYS | {"tp", "model_config", "graph_memory"}


def profile_names() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def resolve_profile_path(name_or_path: str) -> Path:
    """A shipped profile by name, or a YAML file by path."""
    shipped = PROFILES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    raise InputFileError(
        name_or_path, f"no such simulator profile (shipped: {', '.join(profile_names())})"
    )


def _load_model_config(file: str, value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str) or not value:
        raise InputFileError(file, "model_config: expected a model config name or a mapping")
    path = MODEL_CONFIGS_DIR / f"{value}.json"
    if not path.is_file():  # a path: a relative one is the profile's neighbour, not the cwd's
        path = Path(file).parent / Path(value).expanduser()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(file, f"model_config: cannot read {value!r}: {exc}") from None
    if not isinstance(data, dict):
        raise InputFileError(file, f"model_config: {path} does not hold a JSON object")
    return data


#: profile figures are MiB, GB, GB/s, TFLOPS, seconds: none comes near this
MAX_NUMBER = 1e9


def _number(file: str, key: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value <= MAX_NUMBER:
        # not value <= MAX: NaN too (inf GPU memory was an OverflowError in the capacity math)
        raise InputFileError(file, f"{key}: expected a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InputFileError(file, f"{key}: must be {'positive' if positive else '>= 0'}")
    return float(value)


def load_profile(name_or_path: str) -> Profile:
    """Read and validate a profile; every error is one line naming the file and the key."""
    path = resolve_profile_path(name_or_path)
    file = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputFileError(file, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise InputFileError(file, "expected a mapping at the top level")
    unknown = sorted(set(raw) - _ALL_KEYS)
    if unknown:
        raise InputFileError(file, f"{unknown[0]}: unknown key")
    missing = sorted((_ALL_KEYS - _OPTIONAL_KEYS) - set(raw))
    if missing:
        raise InputFileError(file, f"{missing[0]}: missing")
    values: dict[str, Any] = {}
    for key in _NUMBER_KEYS:
        zero_ok = key in ("host_used_gb", "other_gib", "cuda_context_mib", "startup_s")
        values[key] = _number(file, key, raw[key], positive=not zero_ok)
    for key in _STR_KEYS & set(raw):
        if not isinstance(raw[key], str) or not raw[key]:
            raise InputFileError(file, f"{key}: expected a non-empty string")
        values[key] = raw[key]
    if not isinstance(raw["tp"], int) or isinstance(raw["tp"], bool) or not 1 <= raw["tp"] <= 4096:
        raise InputFileError(file, f"tp: expected a positive integer, got {raw['tp']!r}")
    gm = raw["graph_memory"]
    if not isinstance(gm, dict):
        raise InputFileError(file, "graph_memory: expected a mapping")
    bad = sorted(set(gm) ^ _GRAPH_KEYS)
    if bad:
        raise InputFileError(file, f"graph_memory.{bad[0]}: unknown or missing")
    graph = GraphMemory(
        **{k: _number(file, f"graph_memory.{k}", v, positive=False) for k, v in gm.items()}
    )
    timing = raw.get("timing") or {}
    if not isinstance(timing, dict):
        raise InputFileError(file, "timing: expected a mapping")
    from tuner.sim.engine.timing import StepTimeModel  # the engine's own parser: one set of rules

    try:
        StepTimeModel.from_mapping(timing)
    except ConfigError as exc:
        raise InputFileError(file, f"{exc.key}: {exc.detail}") from None
    if values["cuda_context_mib"] >= values["gpu_mem_mib"]:
        raise InputFileError(file, "cuda_context_mib: must be below gpu_mem_mib")
    if values["host_used_gb"] >= values["host_ram_gb"]:
        raise InputFileError(file, "host_used_gb: must be below host_ram_gb")
    return Profile(
        tp=raw["tp"],
        model_config=_load_model_config(file, raw["model_config"]),
        graph_memory=graph,
        timing=timing,
        source=file,
        speculative=parse_speculative(file, raw.get("speculative")),
        dp_attention=parse_dp_attention(file, raw.get("dp_attention")),
        **values,
    )
