"""`tuner check` of a study file with `fleet:`: every worker's target checked as a study of
its own would be, each line naming its worker (`gpu-a: ssh`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tuner.check.lines import CheckLine
from tuner.config.fleet import member_config
from tuner.config.schema import StudyConfig


def each_worker(
    cfg: StudyConfig, check: Callable[[StudyConfig], list[CheckLine]]
) -> list[CheckLine]:
    """`check(worker's config)` for each worker of the fleet, in the file's order, its lines'
    names prefixed with the worker's."""
    assert cfg.fleet is not None
    lines: list[CheckLine] = []
    for name in cfg.fleet.names():
        member = member_config(cfg, name)
        lines += [replace(line, name=f"{name}: {line.name}") for line in check(member)]
    return lines
