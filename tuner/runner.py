"""One trial end to end: pre-check -> (re)start or reuse -> load -> score -> `TrialOutcome`.

No optuna here: `TrialRunner.run` returns a `TrialOutcome` (tuner/trial.py) and tuning.py maps
it to a trial state. The server and the load run are seams (constructor arguments): the real
`lifecycle.Server` and `loadgen` in a study, the simulator or scripted fakes in tests.

Decisions made here: whether a restart is needed (the live server's flags differ, or it died),
what a failed start teaches the pre-check (`_learn_failure`), whether a run stopped by errors
was the server's death, and that a flag the server's parser rejects stops the whole study.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.config import StudyConfig
from tuner.errors import ConfigError
from tuner.launch import LaunchSpec, build_launch, redact_argv
from tuner.lifecycle import ServerDeath, StartResult
from tuner.metrics import goodput
from tuner.precheck import Hardware, Knowledge, precheck
from tuner.sglang.failures import FailureClass
from tuner.sglang.flags import version_hint
from tuner.space import canonical, client_params, server_flags
from tuner.trial import Status, TrialOutcome, failed_outcome, measured_outcome

if TYPE_CHECKING:
    from tuner.config import SLOSection
    from tuner.loadgen import LoadResult

#: after a run stopped by errors, how long to watch for the server's death before blaming errors
DEATH_GRACE_S = 5.0


class ServerControl(Protocol):
    """What a trial needs of the server lifecycle (`lifecycle.Server` is the real one)."""

    def restart(
        self, spec: LaunchSpec, log_path: str, on_launch: Callable[[int], None] | None = None
    ) -> StartResult: ...
    def check(self) -> ServerDeath | None: ...
    def stop(self) -> float: ...
    def fetch_log(self, local_path: str) -> bool: ...


#: (base_url, client-side params such as concurrency and request-rate) -> one load run
LoadRun = Callable[[str, Mapping[str, Any]], "LoadResult"]


def score_load(result: LoadResult, slo: SLOSection) -> dict[str, Any]:
    """LoadResult -> metrics JSON: bench_serving's keys, goodput under the SLOs, the server's view."""
    out = result.summary()
    out["goodput"] = goodput(
        result.records,
        result.duration_s,
        ttft_ms=slo.p99_ttft_ms,
        tpot_ms=slo.p99_tpot_ms,
        e2e_ms=slo.p99_e2e_latency_ms,
    )
    return out


def rejected_flags(cfg: StudyConfig, result: StartResult) -> ConfigError:
    """The server's argument parser refused the command line: every trial would fail the same
    way (e.g. a flag this SGLang version lacks), so the study stops instead of burning a night."""
    evidence = [x for x in result.evidence if x.strip()]
    said = next((x for x in reversed(evidence) if "error" in x.lower()), result.reason).strip()
    named = re.findall(r"--[a-z0-9][a-z0-9-]*", said)
    hints = [f"{f}: {h}" for f in dict.fromkeys(named) if (h := version_hint(f.lstrip("-")))]
    return ConfigError(
        f"the server rejected its command line ({said})"
        + (f" [{'; '.join(hints)}]" if hints else "")
        + ": check the flags under server: and space: against the SGLang version on the host",
        file=cfg.source,
    )


class TrialRunner:
    """Runs trials against one server, reusing it when only client-side params change."""

    def __init__(
        self,
        cfg: StudyConfig,
        server: ServerControl,
        run_load: LoadRun,
        base_url: str,
        hardware: Hardware,
        *,
        knowledge: Knowledge | None = None,
        env: Mapping[str, str] | None = None,
        secret_flags: Mapping[str, str] | None = None,
        launch_template: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg = cfg
        self.server = server
        self.run_load = run_load
        self.base_url = base_url
        self.hardware = hardware
        self.knowledge = knowledge or Knowledge()
        self.env = dict(env or {})
        self.secret_flags = dict(secret_flags or {})  # e.g. api-key, read from the environment
        self.launch_template = list(launch_template or cfg.target.launch)
        self.clock, self.sleep = clock, sleep
        self._running_key: str | None = None  # canonical server flags of the live server
        self.reuses = 0

    def flags_for(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Fixed server flags plus the trial's server-side params."""
        return {**self.cfg.server, **server_flags(params)}

    def run(
        self,
        number: int,
        params: Mapping[str, Any],
        trial_dir: Path,
        on_start: Callable[[int], None] | None = None,
    ) -> TrialOutcome:
        """One trial; raises InfraError (from the server or host) when the world failed.

        `on_start(pgid)` is called as soon as a server process group exists, so a kill of the
        tuner mid-trial still leaves a record of what to stop.
        """
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags = self.flags_for(params)
        objective = self.cfg.objective
        verdict = precheck(flags, self.hardware, self.knowledge)
        if not verdict.feasible:
            return failed_outcome(
                objective, Status.REJECTED, verdict.reason, verdict.kind, flags=flags
            )
        restarted = self._running_key != canonical(flags) or self.server.check() is not None
        info: dict[str, Any] = {}
        if restarted:
            result = self._restart(number, flags, trial_dir, on_start)
            if not result.ok:
                return failed_outcome(
                    objective,
                    Status.START_FAILED,
                    result.reason,
                    result.failure,
                    server_info=result.facts(),
                    restarted=True,
                    launched=True,
                    flags=flags,
                )
            info = result.facts()
        else:
            self.reuses += 1
        load = self.run_load(self.base_url, client_params(params))
        died = self._death_after(load)
        metrics = score_load(load, objective.slo)
        self._save_metrics(trial_dir, metrics, load)
        self._save_log(trial_dir)
        kw = {"server_info": info, "restarted": restarted, "launched": restarted, "flags": flags}
        if died is not None:
            self._running_key = None
            reason = f"server died under load ({died.failure})"
            return failed_outcome(
                objective, Status.DIED, reason, died.failure, metrics=metrics, **kw
            )
        # a run cut by its error budget is the server's doing, not a client that lagged
        lagged = load.flagged and load.stopped != "error_budget"
        return measured_outcome(objective, metrics, client_lagged=lagged, **kw)

    def stop(self) -> None:
        self._running_key = None
        self.server.stop()

    def _restart(
        self,
        number: int,
        flags: Mapping[str, Any],
        trial_dir: Path,
        on_start: Callable[[int], None] | None,
    ) -> StartResult:
        target = self.cfg.target
        spec = build_launch(
            self.launch_template,
            {**flags, **self.secret_flags},
            target.port,
            self.env,
            target.workdir,
        )
        (trial_dir / "launch.txt").write_text(" ".join(redact_argv(spec.argv)) + "\n")
        self._running_key = None
        log = f"{target.workdir or '/tmp'}/tuner-{self.cfg.study}-trial{number}.log"
        result = self.server.restart(spec, log, on_start)
        self._save_log(trial_dir)
        if result.ok:
            self._running_key = canonical(flags)
            self._learn_start(result)
        elif result.failure == FailureClass.BAD_FLAG:
            raise rejected_flags(self.cfg, result)
        else:
            self._learn_failure(result.failure, flags, number)
        return result

    def _death_after(self, load: LoadResult) -> ServerDeath | None:
        """Did the server die during the run? A run cut by errors often races the death itself."""
        deadline = self.clock() + (DEATH_GRACE_S if load.stopped == "error_budget" else 0.0)
        while True:
            died = self.server.check()
            if died is not None or self.clock() >= deadline:
                return died
            self.sleep(0.2)

    # --- learning and records ------------------------------------------------------------

    def _learn_start(self, result: StartResult) -> None:
        tokens, mfs = result.max_total_num_tokens, result.mem_fraction_static
        if tokens and mfs:
            self.knowledge = self.knowledge.with_start(int(tokens), float(mfs))

    def _learn_failure(self, failure: str | None, flags: Mapping[str, Any], number: int) -> None:
        if failure == FailureClass.OOM_CUDA_GRAPH and "mem-fraction-static" in flags:
            self.knowledge = self.knowledge.with_graph_failure(flags, number)

    def _save_log(self, trial_dir: Path) -> None:
        # a missing log is evidence lost, not a reason to fail the trial
        with contextlib.suppress(OSError):
            self.server.fetch_log(str(trial_dir / "server.log"))

    @staticmethod
    def _save_metrics(trial_dir: Path, metrics: Mapping[str, Any], load: LoadResult) -> None:
        (trial_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        with (trial_dir / "requests.jsonl").open("w") as f:
            for rec in load.records:
                f.write(json.dumps(asdict(rec), default=str) + "\n")
