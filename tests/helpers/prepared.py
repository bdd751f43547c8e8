"""A night's study made in a second through tuner's own loop: a scripted server and load run,
real SQLite storage in runs/<study>/study.db, for the commands (`status`, `export`) and other
tools (optuna-dashboard, `optuna.visualization`) to read.

The trials, as `PLAN` scripts them (many params, long reasons, every kind of outcome):

    0  mfs 0.83, conc 64    ok                 1,800 tok/s
    1  mfs 0.87, conc 64    ok, the winner     2,400 tok/s   (0.87 sampled as 0.8700000000000001)
    2  mfs 0.87, conc 256   missed its TTFT SLO 3,100 tok/s   (the highest throughput)
    3  mfs 0.95, conc 64    start failed: CUDA-graph OOM, with SGLang's long message
    4  mfs 0.97, conc 64    rejected by the pre-check (it learned the cliff from 3)
    5  mfs 0.90, conc 128   died under load (oom_runtime), after a partial run
    6  = trial 1's params   answered from trial 1 (a duplicate)
    7  mfs 0.85, conc 32    ok                 1,500 tok/s
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.capacity.precheck import Hardware
from tuner.config.load import load_study
from tuner.search.sampler import make_sampler
from tuner.server.lifecycle import ServerDeath, StartResult
from tuner.study.loop import Tuning
from tuner.study.storage import make_storage, open_study, storage_url
from tuner.trial.runner import TrialRunner

WINNER, SLO_MISS, START_FAILED, REJECTED, DIED, DUPLICATE = 1, 2, 3, 4, 5, 6
FIXED = {
    "chunked-prefill-size": 8192,
    "schedule-conservativeness": 0.8 + 2 * 0.1,  # 1.0000000000000002, as a grid gives it
    "cuda-graph-max-bs": 256,
    "schedule-policy": "lpm",
    "max-running-requests": 512,
}
#: (mfs, concurrency) per trial, mfs as a 0.01 grid computes it (0.8 + k * 0.01)
PLAN = [(3, 64), (7, 64), (7, 256), (15, 64), (17, 64), (10, 128), (7, 64), (5, 32)]
THROUGHPUT = {(3, 64): 1800.0, (7, 64): 2400.0, (7, 256): 3100.0, (5, 32): 1500.0}
OOM_MESSAGE = (
    "Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.19 GiB of which 1.06 GiB is free. Possible solutions: lower "
    "--mem-fraction-static, lower --cuda-graph-max-bs, or disable CUDA graphs"
)

STUDY: dict[str, Any] = {
    "study": "prepared",
    "description": "a scripted night: every outcome, many params",
    "target": {"host": "local", "launch": ["{python}", "-m", "tuner.sim"], "port": 30999},
    "server": {"model-path": "meta-llama/Llama-3.1-8B-Instruct"},
    "space": {
        "mem-fraction-static": {"low": 0.80, "high": 0.98, "step": 0.01},
        "concurrency": {"low": 8, "high": 512, "log": True, "search": "joint"},
        "chunked-prefill-size": {"choices": [4096, 8192, 16384]},
        "schedule-conservativeness": {"low": 0.5, "high": 1.5, "step": 0.1},
        "cuda-graph-max-bs": {"choices": [128, 256, 512]},
        "schedule-policy": {"choices": ["lpm", "fcfs"]},
        "max-running-requests": {"low": 128, "high": 1024, "step": 128},
    },
    "workload": {"kind": "random", "input_len": 1024, "output_len": 128, "duration_s": 60},
    "objective": {"metric": "output_throughput", "slo": {"p99_ttft_ms": 2000}},
    "budget": {"n_trials": len(PLAN), "confirm_top": 0, "concurrency_probes": 0},
    "sampler": {"seed": 1},
}


def mfs(k: int) -> float:
    return 0.8 + k * 0.01


class ScriptedServer:
    """Starts unless mfs > 0.93 (CUDA-graph OOM); the mfs-0.90 server dies under its load."""

    def __init__(self) -> None:
        self.flags: dict[str, Any] = {}
        self.loaded = False

    def restart(self, spec, log_path, on_launch=None):  # type: ignore[no-untyped-def]
        self.flags, self.loaded = dict(spec.flags), False
        if on_launch:
            on_launch(4242)
        m = float(spec.flags["mem-fraction-static"])
        if m > 0.93:
            return StartResult(False, "oom_cuda_graph", OOM_MESSAGE, pgid=4242)
        return StartResult(
            True,
            None,
            "ready",
            pgid=4242,
            max_total_num_tokens=int((m - 0.5) * 1_000_000),
            mem_fraction_static=round(m, 10),  # as SGLang parses it from the command line
            version="0.5.6",
        )

    def check(self) -> ServerDeath | None:
        if self.loaded and abs(float(self.flags["mem-fraction-static"]) - 0.90) < 1e-9:
            return ServerDeath("oom_runtime", "Prefill out of memory", (), 137)
        return None

    def responsive(self, timeout_s: float) -> bool:
        return True

    def stop(self) -> float:
        return 0.0

    def fetch_log(self, local_path: str) -> bool:
        Path(local_path).write_text("log\n")
        return True


@dataclass
class Load:
    """A scripted load run: what loadgen.LoadResult gives a trial."""

    metrics: dict[str, Any] = field(default_factory=dict)
    records: tuple = ()
    duration_s: float = 60.0
    stopped: str = "duration"
    flagged: bool = False

    def summary(self) -> dict[str, Any]:
        return dict(self.metrics)


def _metrics(tput: float, ttft_ms: float) -> dict[str, Any]:
    return {
        "window_output_throughput": tput,
        "output_throughput": tput * 0.9,  # bench_serving's: the cut requests' tokens left out
        "request_throughput": tput / 128,
        "p99_ttft_ms": ttft_ms,
        "p99_tpot_ms": 21.5,
        "p99_itl_ms": 19.25,
        "p99_e2e_latency_ms": ttft_ms + 2800.0,
        "error_rate": 0.0,
        "duration": 60.0,
    }


def scripted_tuning(cfg: Any, study: optuna.Study, runs: Path) -> Tuning:
    """tuner's loop on `study` with the scripted server and load run (virtual time)."""
    server = ScriptedServer()

    def run_load(url: str, client: dict[str, Any]) -> Load:
        k = round((float(server.flags["mem-fraction-static"]) - 0.8) / 0.01)
        key = (k, client["concurrency"])
        server.loaded = True
        if key in THROUGHPUT:
            return Load(_metrics(THROUGHPUT[key], 5000.0 if key[1] == 256 else 900.0))
        return Load(_metrics(350.0, 1.0), stopped="error_budget", flagged=True)  # dying

    now = [0.0]  # virtual time: no wait is real
    runner = TrialRunner(
        cfg,
        server,
        run_load,
        "http://127.0.0.1:1",
        Hardware(),
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    return Tuning(cfg, study, runner, runs / cfg.study / "trials", worker="w1")


def write_study_file(tmp: Path, name: str = "prepared", **over: Any) -> Path:
    data = {**STUDY, "study": name, **over}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def prepared_study(tmp: Path, name: str = "prepared", **over: Any) -> tuple[Path, Path]:
    """Write the study file and run PLAN through tuner's loop; (study file, runs dir)."""
    study_file = write_study_file(tmp, name, **over)
    runs = tmp / "runs"
    cfg = load_study(str(study_file))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(cfg, make_storage(storage_url(cfg, runs), 2), make_sampler(cfg))
    tuning = scripted_tuning(cfg, study, runs)
    for k, conc in PLAN:
        study.enqueue_trial({"mem-fraction-static": mfs(k), "concurrency": conc, **FIXED})
    tuning.optimize(len(PLAN), None)
    return study_file, runs
