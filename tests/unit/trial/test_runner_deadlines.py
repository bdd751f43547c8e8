"""The runner's decisions with scripted fakes: whose failure, reuse checks, hangs, deadlines, phases.

Pure logic: the server and the load run are fakes that follow a script; a fake clock stands for
time, so nothing here sleeps or depends on the machine's speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.studies import study_dict
from tuner.capacity.precheck import Hardware
from tuner.config.load import parse_study
from tuner.errors import HostUnreachable, TrialTimeout
from tuner.loadgen.metrics import RequestRecord
from tuner.outcome import Status
from tuner.server.lifecycle import ServerDeath, StartResult
from tuner.server.records import GPU_USED, GpuMemory
from tuner.trial.runner import HUNG, PHASES, TrialRunner

STUDY = study_dict(
    study="unit",
    server={"model-path": "m", "tensor-parallel-size": 1},
    space={
        "mem-fraction-static": {"low": 0.80, "high": 0.90, "step": 0.02},
        "concurrency": {"choices": [16, 32]},
    },
    objective__slo={"p99_ttft_ms": 5000},
    budget__trial_timeout=600,
)
PARAMS = {"mem-fraction-static": 0.84, "concurrency": 16}
OK_START = StartResult(True, None, "ready", pgid=4242, max_total_num_tokens=1000)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


@dataclass
class Server:
    """A scripted server: start results in order, deaths per check(), /health answers."""

    clock: Clock
    starts: list[StartResult] = field(default_factory=lambda: [OK_START])
    deaths: list[ServerDeath | None] = field(default_factory=list)
    answers: list[bool] = field(default_factory=list)  # responsive() results (default True)
    start_s: float = 1.0
    restarts: int = 0
    stops: int = 0
    probes: list[float] = field(default_factory=list)

    def restart(self, spec, log_path, on_launch=None):
        self.restarts += 1
        if on_launch:
            on_launch(4242)
        self.clock.now += self.start_s
        return self.starts.pop(0) if len(self.starts) > 1 else self.starts[0]

    def check(self):
        return self.deaths.pop(0) if self.deaths else None

    def responsive(self, timeout_s: float) -> bool:
        self.probes.append(timeout_s)
        return self.answers.pop(0) if self.answers else True

    def stop(self):
        self.stops += 1
        return 0.0

    def fetch_log(self, local_path):
        Path(local_path).write_text("log\n")
        return True


def _rec(i: int) -> RequestRecord:
    return RequestRecord(
        index=i, ok=True, prompt_len=10, output_len=10, start_s=0.1 * i, latency_s=1.0, ttft_s=0.1
    )


@dataclass
class Load:
    """A scripted LoadResult (the fields and methods a trial reads)."""

    metrics: dict = field(default_factory=lambda: {"output_throughput": 100.0})
    records: tuple = (_rec(0), _rec(1))
    duration_s: float = 10.0
    stopped: str = "duration"
    flagged: bool = False
    silent_s: float = 0.0

    def summary(self) -> dict:
        return dict(self.metrics)


class LoadRun:
    """The load seam with the keywords the runner passes (`time_limit_s`, `on_phase`)."""

    def __init__(self, clock: Clock, loads: list[Load] | None = None, takes_s: float = 10.0):
        self.clock, self.loads, self.takes_s = clock, loads or [Load()], takes_s
        self.limits: list[float | None] = []

    def __call__(self, url: str, client: dict, *, time_limit_s=None, on_phase=None) -> Load:
        self.limits.append(time_limit_s)
        if on_phase:
            on_phase("warmup")
            on_phase("load")
        self.clock.now += self.takes_s
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


def _runner(server: Server, load: Any, clock: Clock) -> TrialRunner:
    cfg = parse_study(STUDY, "unit.yaml")
    return TrialRunner(
        cfg, server, load, "http://127.0.0.1:1", Hardware(), clock=clock, sleep=clock.sleep
    )


def _setup(**server_kw: Any) -> tuple[Clock, Server, LoadRun, TrialRunner]:
    clock = Clock()
    server = Server(clock, **server_kw)
    load = LoadRun(clock)
    return clock, server, load, _runner(server, load, clock)


def _phases(trial_dir: Path) -> list[str]:
    lines = (trial_dir / "phases.log").read_text().splitlines()
    for line in lines:
        float(line.split()[0])  # unix time with ms
        assert len(line.split()[0].split(".")[1]) == 3
    return [line.split()[1] for line in lines]


# --- whose failure a failed start is ---------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        ("oom_cuda_graph", Status.START_FAILED),
        ("not_enough_memory", Status.START_FAILED),
        ("host_memory", Status.START_FAILED),
        ("crashed", Status.WORLD),
        ("timeout", Status.WORLD),
        ("port_in_use", Status.WORLD),
    ],
)
def test_a_failed_start_is_the_configs_only_with_sglangs_evidence(
    tmp_path: Path, failure: str, status: Status
) -> None:
    failed = StartResult(False, failure, f"why: {failure}", ("line 1",), pgid=4242)
    _, server, load, runner = _setup(starts=[failed])
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == status
    assert out.failure == failure and out.reason == f"why: {failure}"
    assert out.launched and load.limits == []  # no load run against a server that is not up
    assert _phases(tmp_path / "t") == ["restart", "spawn", "done"]


@pytest.mark.parametrize(
    ("death", "status"),
    [
        (
            ServerDeath("oom_runtime", "Decode out of memory", ("Decode out of memory",), 137),
            Status.DIED,
        ),
        (ServerDeath("crashed", "killed by a signal", (), None), Status.WORLD),
    ],
)
def test_a_death_under_load_is_the_configs_only_with_evidence(
    tmp_path: Path, death: ServerDeath, status: Status
) -> None:
    _, server, _, runner = _setup(deaths=[death])
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == status and out.failure == death.failure
    assert out.constraints["c_start"] > 0 and out.metrics  # what it measured is kept
    # the next trial with the same flags restarts rather than reusing a dead server (at less
    # load: the same load on the same flags is what the pre-check learnt to reject)
    runner.run(1, {**PARAMS, "concurrency": PARAMS["concurrency"] // 2}, tmp_path / "t1")
    assert server.restarts == 2


# --- a reused server is checked first --------------------------------------------------------


def test_a_healthy_reused_server_is_probed_and_reused(tmp_path: Path) -> None:
    _, server, _, runner = _setup()
    runner.run(0, PARAMS, tmp_path / "a")
    out = runner.run(1, {**PARAMS, "concurrency": 32}, tmp_path / "b", deadline=300.0)
    assert out.status == Status.OK and not out.restarted and server.restarts == 1
    assert runner.reuses == 1 and len(server.probes) == 1 and server.probes == [5.0]
    assert _phases(tmp_path / "b") == ["ready", "warmup", "load", "scoring", "done"]


def test_a_reused_server_that_died_is_restarted(tmp_path: Path) -> None:
    _, server, _, runner = _setup()
    runner.run(0, PARAMS, tmp_path / "a")
    # trial 0's own death check has passed: the server died between the trials
    server.deaths = [ServerDeath("crashed", "killed by a signal", (), None)]
    out = runner.run(1, PARAMS, tmp_path / "b")
    assert out.status == Status.OK and out.restarted and server.restarts == 2
    assert "died before this trial" in out.server_info["replaced"]
    assert server.probes == []  # a dead server is not asked anything
    assert _phases(tmp_path / "b") == [
        "ready",
        "restart",
        "spawn",
        "ready",
        "warmup",
        "load",
        "scoring",
        "done",
    ]


def test_a_reused_server_that_hung_is_stopped_and_restarted(tmp_path: Path) -> None:
    _, server, _, runner = _setup()
    runner.run(0, PARAMS, tmp_path / "a")
    server.answers = [False]
    out = runner.run(1, PARAMS, tmp_path / "b")
    assert out.status == Status.OK and out.restarted and server.restarts == 2
    assert server.stops == 1 and out.server_info["replaced"].startswith(HUNG)


# --- a run the server stopped answering ------------------------------------------------------


def test_a_silent_run_on_a_hung_server_is_the_worlds_and_the_server_is_stopped(
    tmp_path: Path,
) -> None:
    clock, server, load, runner = _setup(answers=[False])
    load.loads = [Load(stopped="unresponsive", silent_s=15.0, flagged=False)]
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == Status.WORLD and out.failure == HUNG
    assert "stopped answering" in out.reason and "15 s" in out.reason
    assert server.stops == 1 and out.values == (0.0,)  # a failed outcome, never a measured 0
    load.loads = [Load()]
    runner.run(1, PARAMS, tmp_path / "t1")
    assert server.restarts == 2  # the hung server is not reused


def test_a_silent_run_on_a_server_that_still_answers_is_measured(tmp_path: Path) -> None:
    _, server, load, runner = _setup(answers=[True])
    load.loads = [Load(stopped="unresponsive", silent_s=15.0)]
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == Status.OK and server.stops == 0 and len(server.probes) == 1


def test_a_server_that_answered_no_request_is_never_a_measured_zero(tmp_path: Path) -> None:
    _, server, load, runner = _setup(answers=[True])
    load.loads = [Load(metrics={"output_throughput": 0.0}, records=(), stopped="unresponsive")]
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == Status.WORLD and out.failure == HUNG and server.stops == 1


def test_ordinary_errors_are_not_probed(tmp_path: Path) -> None:
    _, server, load, runner = _setup()
    load.loads = [Load(metrics={"output_throughput": 50.0, "error_rate": 0.01})]
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == Status.OK and server.probes == []


# --- deadlines ------------------------------------------------------------------------------


def test_the_load_run_gets_the_time_left_and_a_deadline_passed_in_it_names_it(
    tmp_path: Path,
) -> None:
    clock, server, load, runner = _setup()
    load.takes_s = 50.0
    with pytest.raises(TrialTimeout, match="trial_timeout 600 s passed during load"):
        runner.run(0, PARAMS, tmp_path / "t", deadline=clock.now + 30.0)
    # the restart took 1 s of the 30: the load run was told it had 29 left
    assert load.limits == [pytest.approx(29.0)]
    assert runner.phase == "load"
    assert _phases(tmp_path / "t")[-1] == "load"


def test_a_deadline_passed_during_start_up_ends_the_trial_before_the_load(
    tmp_path: Path,
) -> None:
    clock, server, load, runner = _setup(start_s=40.0)
    with pytest.raises(TrialTimeout, match="during spawn"):
        runner.run(0, PARAMS, tmp_path / "t", deadline=clock.now + 30.0)
    assert load.limits == [] and runner.phase == "spawn"


def test_the_load_runs_own_timeout_is_named_as_the_trials(tmp_path: Path) -> None:
    clock, server, _, _ = _setup()

    def cut(url, client, *, time_limit_s=None, on_phase=None):
        on_phase("load")
        raise TrialTimeout("load run cut at the trial's time left (29 s)")

    runner = _runner(server, cut, clock)
    with pytest.raises(TrialTimeout, match=r"passed during load \(load run cut"):
        runner.run(0, PARAMS, tmp_path / "t", deadline=clock.now + 30.0)


def test_the_health_probe_is_capped_by_the_time_left(tmp_path: Path) -> None:
    clock, server, _, runner = _setup()
    runner.run(0, PARAMS, tmp_path / "a")
    with pytest.raises(TrialTimeout, match="during load"):  # the 10-s load outlives the 3 s
        runner.run(1, PARAMS, tmp_path / "b", deadline=clock.now + 3.0)
    assert server.probes == [3.0]


def test_no_deadline_means_no_limit_and_every_phase_is_logged(tmp_path: Path) -> None:
    clock, server, load, runner = _setup()
    load.takes_s = 5000.0
    out = runner.run(0, PARAMS, tmp_path / "t")
    assert out.status == Status.OK and load.limits == [None]
    assert _phases(tmp_path / "t") == list(PHASES)


def test_a_load_seam_without_the_keywords_still_runs(tmp_path: Path) -> None:
    clock, server, _, _ = _setup()
    runner = _runner(server, lambda url, client: Load(), clock)
    out = runner.run(0, PARAMS, tmp_path / "t", deadline=clock.now + 100)
    assert out.status == Status.OK
    assert _phases(tmp_path / "t") == ["restart", "spawn", "ready", "warmup", "scoring", "done"]


def test_a_config_the_precheck_rejects_logs_done_only(tmp_path: Path) -> None:
    graph = StartResult(False, "oom_cuda_graph", "Capture cuda graph failed", pgid=4242)
    _, server, _, runner = _setup(starts=[graph])
    assert runner.run(0, PARAMS, tmp_path / "a").status == Status.START_FAILED
    out = runner.run(1, PARAMS, tmp_path / "b")  # learned: the same mfs cannot start
    assert out.status == Status.REJECTED and server.restarts == 1
    assert _phases(tmp_path / "b") == ["done"]


def test_a_gpu_reading_the_link_drops_costs_the_reading_not_the_run(tmp_path: Path) -> None:
    """nvidia-smi after a run is optional evidence (search/ceiling.py): a dropped link while
    reading it leaves the measured run as it was, with no reading recorded."""
    clock, server, _, runner = _setup()
    readings: list[GpuMemory | Exception] = [HostUnreachable("link dropped")]

    def gpu_memory() -> GpuMemory:
        got = readings.pop(0) if readings else GpuMemory(70_000.0, 80_000.0)
        if isinstance(got, Exception):
            raise got
        return got

    server.gpu_memory = gpu_memory  # type: ignore[attr-defined]
    lost = runner.run(0, PARAMS, tmp_path / "0", fresh=True)
    assert lost.status == Status.OK and GPU_USED not in lost.server_info
    read = runner.run(1, PARAMS, tmp_path / "1", fresh=True)
    assert read.status == Status.OK and read.server_info[GPU_USED] == 70_000.0
