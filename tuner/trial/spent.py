"""Where one trial's server time went, phase by phase, on the runner's clock. Pure.

The runner's clock is the wall's (`time.monotonic`) in a study on a host and the virtual
clock in a `--virtual` one (tuner/sim/virtual/study.py), so a virtual study records virtual
seconds. Each phase the runner enters (trial/runner.py `PHASES`) lasts until it enters the
next; a trial's record, stored as its `Attr.SPENT` user attribute (and each confirmation run's
in the study, verdict/gpuhours.py), is

    {"startup_s": 612.0, "warmup_s": 8.1, "load_s": 1500.3, "stop_s": 4.2, "other_s": 1.0,
     "server_s": 2125.6, "gpus": 8}

- startup: restart and spawn, up to ready, less the stop of the server before;
- warmup, load: the load runs' (every point of an inner search);
- stop: stopping the server before, at this trial's restart (the lifecycle's `Timings.stop_s`);
- other: the checks between (is the reused server alive, scoring);
- server_s: the sum, the time the trial held the GPUs; gpus: how many the launched flags use
  (capacity.layout.parallel_of: TP x PP, x DP when DP runs replicas).
"""

from __future__ import annotations

from collections.abc import Callable

from tuner.outcome import SPENT_KEYS as KEYS

#: the runner's phase -> the record's key (a phase not named here is `other_s`; `done` ends)
BUCKETS = {"restart": "startup_s", "spawn": "startup_s", "warmup": "warmup_s", "load": "load_s"}
DONE = "done"


class PhaseTimes:
    """One trial's seconds per phase on `clock`; `record()` closes the phase it is in."""

    def __init__(self, clock: Callable[[], float], gpus: int = 1):
        self.clock = clock
        self.gpus = gpus
        self.phase: str | None = None
        self.since = 0.0
        self.seconds = dict.fromkeys(KEYS, 0.0)
        self.stop_s = 0.0

    def enter(self, phase: str) -> None:
        """The trial moved to `phase` (`done`: nothing more to count)."""
        self._close()
        self.phase = None if phase == DONE else phase

    def stopped(self, stop_s: float) -> None:
        """The restart in progress spent `stop_s` of its time stopping the server before."""
        self.stop_s += max(0.0, stop_s)

    def record(self) -> dict[str, float | int]:
        """The trial's record so far (the phase it is in counted up to now)."""
        self._close()
        out = dict(self.seconds)
        stop = min(self.stop_s, out["startup_s"])  # the stop ran inside the restart phase
        out["startup_s"] -= stop
        out["stop_s"] += stop
        rec: dict[str, float | int] = {k: round(v, 3) for k, v in out.items()}
        rec["server_s"] = round(sum(out.values()), 3)
        rec["gpus"] = self.gpus
        return rec

    def _close(self) -> None:
        now = self.clock()
        if self.phase is not None:
            self.seconds[BUCKETS.get(self.phase, "other_s")] += max(0.0, now - self.since)
        self.since = now
