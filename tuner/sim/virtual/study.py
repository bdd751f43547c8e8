"""`tuner tune STUDY.yaml --virtual`: a study's server and load seams in virtual time.

`virtual_seams(seed)` is a seams factory for `api.tune(..., make_seams=...)`: everything but the
server and the load run is the real study (sampler, pre-check, reuse, probes, confirmation,
export, storage, resume). The server is a `VirtualServer` (no process, no port), the load run a
`VirtualRun` on its engine (no HTTP), and the trial runner reads their virtual clock, so a
40-trial study takes seconds. Only a study whose launch is the simulator can run this way:
`target.launch` must be `[{python}, -m, tuner.sim, --sim-profile, NAME, ...]`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner.api import STUDY_MAX_LOOP_LAG_MS, Seams, study_requests
from tuner.capacity.calculus import GB
from tuner.capacity.models import hardware_of
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError, HostUnreachable, TunerError
from tuner.loadgen.plan import refill_for, study_load_options
from tuner.loadgen.result import Cut, LoadResult
from tuner.loadgen.workload import Request
from tuner.server.target import Launch
from tuner.sim.flags import DEFAULT_PROFILE, FlagError, given_value, parse_flags
from tuner.sim.profile import load_profile
from tuner.sim.virtual.load import VirtualRun
from tuner.sim.virtual.server import SIM_MODULE, VirtualClock, VirtualServer, sim_args
from tuner.trial.runner import TrialRunner

SeamsFactory = Callable[[StudyConfig, str | None, str | None], Seams]
EXPECTED = "[{python}, -m, tuner.sim, --sim-profile, NAME, ...]"


class VirtualLoad:
    """The load seam: (base_url, client params, time_limit_s=, on_phase=, cut=) -> LoadResult, on
    the virtual server's engine with the study's one fixed request list."""

    def __init__(self, server: VirtualServer, cfg: StudyConfig, requests: list[Request]):
        self.server = server
        self.cfg = cfg
        self.requests = requests
        self._ids: dict[tuple[int, str], tuple[int, ...]] = {}
        self.runs = 0

    def __call__(
        self,
        url: str,
        client: Mapping[str, Any],
        *,
        time_limit_s: float | None = None,
        on_phase: Callable[[str], None] | None = None,
        cut: Cut | None = None,
    ) -> LoadResult:
        options = study_load_options(self.cfg, client, max_loop_lag_ms=STUDY_MAX_LOOP_LAG_MS)
        proc = self.server.process
        if proc is None:  # what the client meets when nothing listens on the port
            raise HostUnreachable(f"cannot reach {url}: connection refused (no server running)")
        self.runs += 1
        more = refill_for(self.cfg.workload)
        run = VirtualRun(proc, self.requests, options, self._ids, more, cut)
        return run.run(time_limit_s, on_phase)


class NullHost:
    """The host of a virtual study: nothing to connect to, nothing to close."""

    name = address = "virtual"

    def close(self) -> None:
        return None


def check_launch(cfg: StudyConfig) -> None:
    """A virtual study needs the simulator as its launch, with a profile that loads."""

    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"--virtual runs the simulator's engine: {why}; expected {EXPECTED}",
            file=cfg.source,
            key="target.launch",
        )

    args = sim_args(cfg.target.launch)
    if args is None:
        raise bad(f"the launch does not run `-m {SIM_MODULE}`")
    if not any(a == "--sim-profile" or a.startswith("--sim-profile=") for a in args):
        raise bad("no --sim-profile in the launch")
    if any(a.startswith("--sim-fault") for a in args):
        raise bad("--sim-fault injects the world's failures into processes, which it has none of")
    try:
        load_profile(parse_flags([*args, "--model-path", "m"]).sim_profile)
    except FlagError as exc:
        raise bad(exc.message) from None
    except TunerError as exc:
        raise bad(str(exc)) from None


def virtual_seams(
    seed: int = 0, *, noise: bool = True, requests: list[Request] | None = None, smi: bool = True
) -> SeamsFactory:
    """A factory of virtual seams; `seed` draws each start's noise (same seed, same study).
    `requests`: the study's request list when the caller built it already (benchmarks); `smi`:
    the host reads its GPU memory as nvidia-smi would, as a GPU host and the HTTP simulator's
    do (False: a host without nvidia-smi)."""

    def build(cfg: StudyConfig, api_key: str | None, marker: str | None = None) -> Seams:
        check_launch(cfg)
        launch = Launch.of(cfg.target)
        clock = VirtualClock()
        server = VirtualServer(seed, noise=noise, clock=clock, smi=smi)
        listed = study_requests(cfg) if requests is None else requests
        runner = TrialRunner(
            cfg,
            server,
            VirtualLoad(server, cfg, listed),
            f"virtual://{cfg.study}",  # nothing listens: the load seam takes the engine
            hardware_of(cfg),
            env=launch.env,
            secret_flags={"api-key": api_key} if api_key else None,
            launch_template=launch.template,
            clock=clock.now,
            sleep=clock.sleep,
        )
        meminfo = functools.partial(launch_meminfo, launch.template)
        n = len(listed)
        return Seams(NullHost(), server, runner, launch, n_requests=n, meminfo=meminfo)  # type: ignore[arg-type]

    return build


def launch_meminfo(argv: Sequence[str]) -> dict[str, int]:
    """/proc/meminfo's MemTotal and MemAvailable (bytes) on the host a simulator launch plays:
    its profile's host RAM, less what the host's other tenants hold (`host_used_gb`); empty
    when the launch is not the simulator's or its profile does not load (the launch then fails
    with the simulator's own message)."""
    args = sim_args(argv)
    if args is None:
        return {}
    try:
        p = load_profile(given_value(args, "--sim-profile") or DEFAULT_PROFILE)
    except TunerError:
        return {}
    return {"MemTotal": int(p.host_ram_gb * GB), "MemAvailable": int(p.host_available_gb * GB)}
