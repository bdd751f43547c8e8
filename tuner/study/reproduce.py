"""When a world failure becomes the configuration's: it came back the same way on every retry
of the same params, and the host was known to work when those tries began. Pure: it reads the
study's trials.

Design principle 11 allows a trial to be infeasible only on evidence against its flags. A crash
(or hang, or a start not ready in time) without SGLang's message is the world's; the same one on
every retry is evidence, but only where the world was working: on a host that broke before the
tries (a driver gone, a disk full, every start hanging) each configuration would reproduce its
failure, and counting them would write false cliffs that outlive the fix. So the last server
this worker launched before the first try must have run (measured, or failed with SGLang's own
evidence); otherwise the tries stay failed and the runaway halt (3 in a row) stops the night.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial

from tuner.outcome import Attr, Status

#: statuses that prove a server ran on the host (measured, or SGLang's own evidence)
_RAN = frozenset({Status.OK, Status.SLO_MISSED, Status.START_FAILED, Status.DIED})


def counts_as_configs(
    trials: list[FrozenTrial], attrs: Mapping[str, Any], failure: str | None, worker: str
) -> bool:
    """The try with user attributes `attrs` (its retries spent) failed as `failure`; is that
    now the configuration's? `trials`: the study's, indexed by number."""
    first = _first_try(trials, attrs, failure)
    return first is not None and _host_worked_before(trials, first, worker)


def _first_try(
    trials: list[FrozenTrial], attrs: Mapping[str, Any], failure: str | None
) -> int | None:
    """The number of the chain's first try when every earlier try failed as `failure`, else
    None (a hang, then a crash, then a timeout is a bad night, not a configuration)."""
    first = None
    for _ in range(int(attrs.get(Attr.RETRIES, 0))):
        n = int(attrs.get(Attr.RETRY_OF, -1))
        prev = trials[n] if 0 <= n < len(trials) else None
        if failure is None or prev is None or prev.user_attrs.get(Attr.FAILURE) != failure:
            return None
        first, attrs = n, prev.user_attrs
    return first


def _host_worked_before(trials: list[FrozenTrial], first: int, worker: str) -> bool:
    """The last trial of `worker` before `first` that ran a load or launched a server: did its
    server run? (Rejected trials and answered duplicates launched nothing: skipped.)"""
    for t in reversed(trials[:first]):
        a = t.user_attrs
        if a.get(Attr.WORKER) not in (None, worker) or Attr.DUPLICATE_OF in a:
            continue
        status = a.get(Attr.STATUS)
        if status == Status.REJECTED or (status is None and Attr.INFRA_ERROR not in a):
            continue  # nothing launched (or a trial interrupted before it ran)
        return status in _RAN and not a.get(Attr.REPRODUCED)
    return False
