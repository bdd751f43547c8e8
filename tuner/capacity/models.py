"""Model configs: a Hugging Face config.json by path, or one shipped in tuner/model_configs by
name; and the pre-check's facts about a study's model and machine (`hardware_of`)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.capacity.calculus import kv_layout
from tuner.capacity.precheck import Hardware, parallel_of
from tuner.config.schema import StudyConfig
from tuner.config.yamlfile import special_file
from tuner.errors import ConfigError, InputFileError, ModelConfigError
from tuner.sglang.flags import effective_flags

#: a config.json is a few KB (the largest, with their quantization tables, well under 1 MiB)
MAX_CONFIG_BYTES = 16 << 20


def shipped_model_configs() -> list[str]:
    """Names of the config.json excerpts that ship with tuner (facts, not downloads)."""
    folder = resources.files("tuner") / "model_configs"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_model_config(name_or_path: str) -> dict[str, Any]:
    """Read a config.json (a path, a directory holding one, or a shipped name like `kimi-k2.5`)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        shipped = resources.files("tuner") / "model_configs" / f"{name_or_path}.json"
        if shipped.is_file():
            return json.loads(shipped.read_text())
        names = ", ".join(shipped_model_configs())
        raise InputFileError(str(name_or_path), f"no such file (or shipped model config: {names})")
    special = special_file(path)
    if special:
        raise InputFileError(str(path), special)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:  # the weights named by mistake: GBs read whole
            raise InputFileError(
                str(path), f"larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config.json"
            )
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputFileError(str(path), f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputFileError(str(path), "not UTF-8 text (a Hugging Face config.json is)") from None
    except RecursionError:  # json nests by recursion: [[[[...]]]] a million deep
        raise InputFileError(str(path), "not valid JSON: nested too deeply") from None
    except ValueError:  # Python refuses to parse an integer of more than 4300 digits
        raise InputFileError(str(path), "not valid JSON: an integer too long") from None
    if not isinstance(data, dict):
        raise InputFileError(str(path), "expected a JSON object (a Hugging Face config.json)")
    return data


def hardware_of(cfg: StudyConfig) -> Hardware:
    """The pre-check's facts: the model config (each trial's bytes per token from its own
    flags) and the study's fixed flags' bytes per token, GPU memory, host RAM."""
    hw = cfg.hardware
    bpt, model = None, None
    server = effective_flags(cfg.server)
    if hw.model_config_path:
        tp = parallel_of(server).attn_tp
        kv_dtype = str(server.get("kv-cache-dtype", "auto"))
        if kv_dtype == "bfloat16":
            kv_dtype = "bf16"
        try:
            model = load_model_config(hw.model_config_path)
            bpt = kv_layout(model, tp, kv_dtype).bytes_per_token
        except ModelConfigError as exc:
            where = f"{hw.model_config_path}: {exc}"
            raise ConfigError(where, file=cfg.source, key="hardware.model_config") from None
    return Hardware(
        bytes_per_token=bpt,
        gpu_mem_mib=hw.gpu_mem_mib,
        host_ram_gb=hw.host_ram_gb,
        weights_gib=hw.weights_gib,
        model_config=model,
        server=server,
    )
