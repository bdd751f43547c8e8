"""tuner's study loop on a scripted server and load run, on real SQLite storage: `setup` builds
a study of `STUDY` (or any study dict) with a `FakeServer` whose CUDA graphs fail above an mfs
and a load whose throughput and TTFT follow the pool (unit tests of the loop's fault paths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.studies import study_dict
from tuner.capacity.precheck import Hardware
from tuner.config.load import parse_study
from tuner.errors import HostUnreachable
from tuner.search.sampler import make_sampler
from tuner.server.lifecycle import StartResult
from tuner.study.loop import Tuning
from tuner.study.storage import make_storage, open_study, storage_url
from tuner.trial.runner import TrialRunner


class FakeServer:
    """Starts unless mfs > graph_cliff (CUDA-graph OOM); `drop` raises an infra error once."""

    def __init__(self, graph_cliff: float = 0.93, drop_on: set[int] | None = None):
        self.graph_cliff = graph_cliff
        self.restarts: list[dict] = []
        self.stopped = 0
        self.drop_on = set(drop_on or ())

    def restart(self, spec, log_path, on_launch=None):
        n = len(self.restarts)
        if on_launch:
            on_launch(4242)
        self.restarts.append(dict(spec.flags))
        if n in self.drop_on:
            self.drop_on.discard(n)
            raise HostUnreachable("ssh 127.0.0.1:22: connection dropped")
        mfs = float(spec.flags.get("mem-fraction-static", 0.8))
        if mfs > self.graph_cliff:
            return StartResult(
                False, "oom_cuda_graph", "Capture cuda graph failed: CUDA out of memory", pgid=4242
            )
        tokens = int((mfs - 0.5) * 1_000_000)
        return StartResult(
            True, None, "ready", pgid=4242, max_total_num_tokens=tokens, mem_fraction_static=mfs
        )

    def check(self):
        return None

    def responsive(self, timeout_s):
        return True

    def stop(self):
        self.stopped += 1

    def fetch_log(self, local_path):
        Path(local_path).write_text("log\n")
        return True


@dataclass
class Load:
    """A scripted load run: what loadgen.LoadResult gives a trial."""

    metrics: dict = field(default_factory=dict)
    records: tuple = ()
    duration_s: float = 1.0
    stopped: str = "done"
    flagged: bool = False

    def summary(self) -> dict:
        return dict(self.metrics)


def make_runner(cfg, server):
    state: dict[str, Any] = {}

    def run_load(url: str, client: dict) -> Load:
        concurrency = client["concurrency"]
        mfs = float(state["flags"].get("mem-fraction-static", 0.8))
        capacity = (mfs - 0.5) * 400
        tput = min(concurrency, capacity) * 10.0
        ttft = max(0.0, concurrency - capacity) * 100.0
        return Load({"output_throughput": tput, "p99_ttft_ms": ttft, "error_rate": 0.0})

    runner = TrialRunner(cfg, server, run_load, "http://127.0.0.1:1", Hardware())
    original = runner.flags_for

    def flags_for(params):
        state["flags"] = original(params)
        return state["flags"]

    runner.flags_for = flags_for  # lets the scripted load see the server's flags
    return runner


STUDY = study_dict(
    study="unit",
    server={"model-path": "m", "tensor-parallel-size": 1},
    space={
        "mem-fraction-static": {"low": 0.80, "high": 0.96, "step": 0.02},
        "concurrency": {"choices": [16, 32, 64, 128]},
    },
    objective__slo={"p99_ttft_ms": 5000},
    sampler={"seed": 1, "n_startup_trials": 4},
    budget__confirm_top=0,
)


def setup(tmp_path: Path, data=None, server=None):
    cfg = parse_study(data or STUDY, "unit.yaml")
    storage = make_storage(storage_url(cfg, tmp_path), 2)
    study = open_study(cfg, storage, make_sampler(cfg))
    server = server or FakeServer()
    runner = make_runner(cfg, server)
    return cfg, study, server, Tuning(cfg, study, runner, tmp_path / "trials", worker="w1")
