"""A study file read and checked once, strictly: the schema (config/schema.py), then the checks
against SGLang's flag table, the model and memory (config/validate.py). Everything that takes a study
file calls `load_study` (or `parse_study` for a mapping already read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.config.fleet import check_members
from tuner.config.schema import StudyConfig, parse_schema
from tuner.config.validate import check_study
from tuner.config.yamlfile import load_yaml


def parse_study(data: Any, source: str = "<study>") -> StudyConfig:
    """Validate an already-parsed mapping; raise ConfigError naming the first bad key."""
    cfg = parse_schema(data, source)
    check_study(cfg)
    check_members(cfg, check_study)  # a fleet's: each worker's target against the rest
    return cfg


def load_study(path: str | Path) -> StudyConfig:
    """Read and validate a study file."""
    return parse_study(load_yaml(Path(path)), source=str(path))
