"""`tuner check STUDY.yaml`: everything that can be known before the night, one line each.

Each check is a small function returning a `CheckLine` (ok / warn / FAIL / skip, its name, what
it found and what to do); `plan.CHECKS` orders them and names what each depends on. The cheap
part (`plan.before_night`) runs in `tuner tune` before its first trial.
"""

from __future__ import annotations

from tuner.check.lines import FAIL, OK, SKIP, WARN, CheckLine, render
from tuner.check.plan import before_night, run_checks
from tuner.check.probe import Deadlines

__all__ = [
    "FAIL",
    "OK",
    "SKIP",
    "WARN",
    "CheckLine",
    "Deadlines",
    "before_night",
    "render",
    "run_checks",
]
