"""A trial runner on the simulator's virtual clock, built as `tuner tune --virtual` builds it.

`virtual_runner(cfg)` is the runner of `tuner.sim.virtual.study.virtual_seams`: a
`VirtualServer` (no process, no port) as the server, a `VirtualLoad` on its engine (no HTTP) as
the load run, and the runner's clock and sleep on the server's `VirtualClock`, so a trial takes
no wall time. Its server is `runner.server`, its clock `runner.server.clock`.
"""

from __future__ import annotations

from tuner.capacity.precheck import Hardware
from tuner.config.schema import StudyConfig
from tuner.loadgen.workload import Request
from tuner.sim.virtual.study import virtual_seams
from tuner.trial.runner import TrialRunner


def virtual_runner(
    cfg: StudyConfig,
    seed: int = 0,
    *,
    noise: bool = True,
    hardware: Hardware | None = None,
    requests: list[Request] | None = None,
) -> TrialRunner:
    """The runner `tuner tune --virtual` runs `cfg`'s trials with. `seed` and `noise` as
    `VirtualServer`'s; `hardware` replaces what the study file says (`hardware_of(cfg)`);
    `requests`: the study's request list when the test built it already."""
    runner = virtual_seams(seed, noise=noise, requests=requests)(cfg, None).runner
    if hardware is not None:
        runner.hardware = hardware
    return runner
