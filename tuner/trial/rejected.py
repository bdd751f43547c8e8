"""A command line SGLang's own checks refused: the study file's mistake, or one configuration's.

SGLang refuses a command line in its argument parser (a flag this version lacks, a bad value)
or in its own checks after parsing ("The arguments enable-hierarchical-cache and
disable-radix-cache are mutually exclusive"). Before any server of this run has started, the
refusal is taken as the study file's (the fixed flags, or the version on the host): every trial
would fail the same way, so the study stops with one line (`rejected_flags`) instead of burning
a night. Once a server has started with the same fixed flags, a refusal can only come from the
searched values: that configuration is infeasible (SGLang's message as its reason) and the
night goes on.
"""

from __future__ import annotations

import re

from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError
from tuner.server.records import StartResult
from tuner.sglang.flags import version_hint


def study_file_at_fault(started_before: bool) -> bool:
    """Is a refused command line the study file's (stop) rather than one configuration's?"""
    return not started_before


def rejected_flags(cfg: StudyConfig, result: StartResult) -> ConfigError:
    """The one line that stops the study: what SGLang said, and a hint for flags that some
    SGLang versions lack."""
    evidence = [x for x in result.evidence if x.strip()]
    said = next((x for x in reversed(evidence) if "error" in x.lower()), result.reason).strip()
    named = re.findall(r"--[a-z0-9][a-z0-9-]*", said)
    hints = [f"{f}: {h}" for f in dict.fromkeys(named) if (h := version_hint(f.lstrip("-")))]
    return ConfigError(
        f"the server rejected its command line ({said})"
        + (f" [{'; '.join(hints)}]" if hints else "")
        + ": check the flags under server: and space: against the SGLang version on the host",
        file=cfg.source,
    )
