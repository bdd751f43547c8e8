"""The serving simulator's GPU reading, published for the simulated nvidia-smi (sim/gpustate.py).

What nvidia-smi reads moves only when the largest prefill since start or the last flush moves
(sim/memplan.py `smi_used_mib`), so the engine loop hands `note` each step's peak and the file is
rewritten only then: a few writes per load run, none per token.
"""

from __future__ import annotations

import contextlib
import os

from tuner.sim.gpustate import GpuState, remove_state, sweep_stale, write_state
from tuner.sim.memplan import MemoryPlan, smi_used_mib
from tuner.sim.profile import Profile


class GpuMeter:
    """One serving process's reading on `port`, over `gpus` GPUs."""

    def __init__(self, port: int, profile: Profile, plan: MemoryPlan, gpus: int):
        self.port, self.profile, self.plan, self.gpus = port, profile, plan, max(gpus, 1)
        self.pid = os.getpid()
        self._peak: int | None = None
        with contextlib.suppress(OSError):
            sweep_stale()

    def note(self, peak_prefill_tokens: int) -> None:
        """Publish the reading if the peak moved (an OSError costs the reading, never the
        server: a real server does not depend on nvidia-smi)."""
        if peak_prefill_tokens == self._peak:
            return
        used = smi_used_mib(self.profile, self.plan, peak_prefill_tokens)
        try:
            write_state(self.port, GpuState(self.pid, self.gpus, round(used, 1)))
        except OSError:
            return  # written at the next step's note: a stale file would read too little
        self._peak = peak_prefill_tokens

    def close(self) -> None:
        remove_state(self.port, self.pid)
