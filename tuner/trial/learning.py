"""What trials teach the pre-check (`capacity.precheck.Knowledge`), live and recalled.

Live: the runner folds in each start (the pool's calibration), each failed start with SGLang's
evidence (a CUDA-graph failure bounds mfs from above, "Not enough memory" from below, "Not
enough host memory" bounds hicache-size) and each death under load. Recalled: the same, rebuilt
from the study's stored trials before each trial (`recalled`), so a resumed run and the other workers of a shared study do not pay a restart
to relearn what an earlier run or another worker already paid for. Pure: no optuna calls, no
I/O; the trials come in as optuna's `FrozenTrial`s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tuner.capacity.precheck import Knowledge
from tuner.outcome import Attr, Status, TrialOutcome
from tuner.sglang.failures import FailureClass
from tuner.sglang.flags import effective_flags
from tuner.trial.inner import died_at

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

#: a trial's flags: normalized (a `LaunchFlags`, as `TrialRunner.flags_for` gives them) or
#: not (then each function normalizes them itself)
Flags = Mapping[str, Any]


def learned_start(know: Knowledge, tokens: Any, mfs: Any, flags: Flags | None = None) -> Knowledge:
    """A start that reported its pool: the first one calibrates the pool's projection, the
    first of each layout (`flags`: its launch flags) that layout's trials."""
    if tokens and mfs:
        return know.with_start(int(tokens), float(mfs), flags)
    return know


#: SGLang's words when the host cannot pin a HiCache pool that large (a larger one fails too);
#: not its "host memory should be larger than the device memory", which a larger size cures
TOO_LARGE_FOR_HOST = re.compile(r"not enough host memory available", re.IGNORECASE)


def learned_failure(
    know: Knowledge, failure: str | None, flags: Flags, number: int, reason: str = ""
) -> Knowledge:
    """A failed start with SGLang's evidence against its flags: a CUDA-graph failure or "Not
    enough memory" bounds mfs for these memory flags, a HiCache pool the host could not pin
    bounds hicache-size for these ranks (`reason`: SGLang's line)."""
    if failure == FailureClass.HOST_MEMORY and TOO_LARGE_FOR_HOST.search(reason or ""):
        return know.with_host_failure(flags, number)
    if "mem-fraction-static" not in effective_flags(flags):
        return know  # SGLang's own default: nothing to bound
    if failure == FailureClass.OOM_CUDA_GRAPH:
        return know.with_graph_failure(flags, number)
    if failure == FailureClass.NOT_ENOUGH_MEMORY:
        return know.with_floor(flags, number)
    return know


def learned_death(
    know: Knowledge, outcome: TrialOutcome, flags: Flags, params: Flags, number: int | None
) -> Knowledge:
    """A death under load with SGLang's evidence (a prefill out of memory) at mfs m and
    concurrency c: servers with the same memory flags and mfs >= m die at c or more."""
    c = died_at(outcome, params)
    if c is None or number is None or "mem-fraction-static" not in effective_flags(flags):
        return know
    return know.with_death(flags, c, number)


def recalled(
    know: Knowledge,
    trials: Iterable[FrozenTrial],
    flags_for: Callable[[Flags], Flags],
    worker: str | None = None,
) -> Knowledge:
    """`know` plus what the study's trials taught when they ran (`flags_for`: a trial's params
    -> its server's flags). Only trials that ran teach (a death on a reused server too): a
    pre-check's rejection restates what was known, a duplicate is its original's record, a
    world failure (FAIL) says nothing of the flags. Entries already known are not added twice.
    A host that could not pin a HiCache size teaches only its own worker (`worker`: each
    worker drives its own host, and hosts differ in free RAM where GPUs are alike)."""
    for t in sorted(trials, key=lambda t: t.number):
        a = t.user_attrs
        outcome = TrialOutcome.from_attrs(a)
        if outcome is None or outcome.status == Status.REJECTED or Attr.DUPLICATE_OF in a:
            continue
        flags = flags_for(t.params)
        if outcome.status == Status.START_FAILED:
            other_host = worker is not None and a.get(Attr.WORKER) not in (None, worker)
            if not (other_host and outcome.failure == FailureClass.HOST_MEMORY):
                know = learned_failure(know, outcome.failure, flags, t.number, outcome.reason)
            continue
        info = a.get(Attr.SERVER_INFO) or {}
        know = learned_start(
            know, info.get("max_total_num_tokens"), info.get("mem_fraction_static"), flags
        )
        points = tuple(a.get(Attr.LOAD_POINTS) or ())
        know = learned_death(know, replace(outcome, points=points), flags, t.params, t.number)
    return know
