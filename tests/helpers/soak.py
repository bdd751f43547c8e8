"""The chaos soak (issue 10's proof), shared by the CI test and the long benchmark.

The same study runs twice through the real sshd, side by side: once clean, once with simulator
faults armed at seeded rates and a relay between the tuner and sshd that cuts SSH connections at
random. `run_soak` runs both and checks what every soak must show: each run exits 0, every trial
is accounted for (completed with a status, or failed with the world's reason and retried within
bounds), no server is left behind, the faulted run takes at most 3x the clean run's wall time
and exports a winner as good as the clean run's within noise. It returns what fired, so a caller
can ask more (tests/integration/study/test_chaos_soak.py: every fault kind).
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import yaml

from tests.helpers.procs import kill_marked, marked_groups
from tests.helpers.relay import Relay
from tests.helpers.sshd import Sshd
from tests.helpers.studies import REPO, TUNER, study_file
from tuner.outcome import Attr
from tuner.sim.faultspec import PREFIX
from tuner.study.worklock import marker_for
from tuner.verdict.winner import best_trial

TUNE = [*TUNER, "tune"]
#: the line the simulator logs once start-up is over
READY_LINE = "The server is fired up and ready to roll!"


@dataclass(frozen=True)
class Soak:
    """What a soak run saw: per fault kind, how often it fired; the SSH connections cut."""

    fired: Counter[str]
    cuts: int


def _study(
    tmp: Path,
    name: str,
    sshd: Sshd,
    ssh_port: int,
    n_trials: int,
    faults: list[str],
    seed: int,
    mfs_high: float | None,
) -> Path:
    path = study_file(tmp, name=name, n_trials=n_trials)
    data = yaml.safe_load(path.read_text())
    if mfs_high is not None:
        data["space"]["mem-fraction-static"]["high"] = mfs_high
    launch = data["target"]["launch"]
    launch[launch.index("--sim-startup-seconds") + 1] = "0.2"
    if faults:
        for spec in faults:
            launch += ["--sim-fault", spec]
        launch += ["--sim-seed", str(seed), "--sim-fault-state", str(tmp / f"{name}.faults")]
    known = sshd.known_hosts if ssh_port == sshd.port else sshd.known_hosts_at(ssh_port, tmp)
    data["target"].update(
        host="127.0.0.1",
        workdir=str(tmp),
        ssh={
            "user": "root",
            "port": ssh_port,
            "identity_file": str(sshd.client_key),
            "known_hosts": str(known),
            "ssh_config": "",
            "use_agent": False,
            "look_for_keys": False,
        },
        timeouts={"ready_s": 8, "stop_s": 5, "port_free_s": 5},
    )
    data["workload"].update(input_len=128, output_len=32, duration_s=1.0, max_error_rate=0.3)
    # the injected 5xx and cut streams are the world's: the user's error budget absorbs them
    data["objective"]["slo"].update(p99_ttft_ms=800, max_error_rate=0.1)
    data["budget"].update(confirm_top=1, confirm_repeats=2, max_consecutive_infra_failures=6)
    data["baseline"] = {"mem-fraction-static": 0.88, "concurrency": 16}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tune(study: Path, runs: Path) -> subprocess.Popen:
    # stderr to a file: the plain progress lines of many trials outgrow a pipe nobody drains
    err = (runs.parent / f"{study.stem}.stderr").open("w+")
    proc = subprocess.Popen(
        [*TUNE, str(study), "--runs-dir", str(runs), "--worker", "soak", "--no-progress"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    proc.err_file = err  # type: ignore[attr-defined]
    return proc


def _finish(procs: dict[str, subprocess.Popen], t0: float) -> dict[str, tuple[int, str, float]]:
    """Wait for study runs side by side: name -> (exit code, stderr, wall seconds of its own)."""
    done: dict[str, tuple[int, str, float]] = {}
    deadline = t0 + 1200
    while len(done) < len(procs) and time.monotonic() < deadline:
        for name, proc in procs.items():
            if name not in done and proc.poll() is not None:
                took = time.monotonic() - t0
                proc.err_file.seek(0)  # type: ignore[attr-defined]
                done[name] = (proc.returncode, proc.err_file.read(), took)  # type: ignore[attr-defined]
        time.sleep(0.2)
    for name, proc in procs.items():
        if name not in done:
            proc.kill()
            proc.wait(timeout=30)
            done[name] = (-1, "timed out", time.monotonic() - t0)
        proc.err_file.close()  # type: ignore[attr-defined]
    return done


def _load(runs: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{runs / name / 'study.db'}")


@dataclass(frozen=True)
class Launch:
    """One simulator launch as its own log on the host tells it: what was armed, whether its
    start-up finished, what fired, how it ended (the `.exit` file's code, None if absent)."""

    index: int
    armed: tuple[str, ...]
    ready: bool
    fired: Counter[str]
    exit: str | None

    def line(self) -> str:
        fired = ", ".join(f"{k} x{n}" for k, n in sorted(self.fired.items())) or "nothing"
        return (
            f"launch {self.index}: armed {', '.join(self.armed) or 'nothing'}; "
            f"{'ready' if self.ready else 'never ready'}; fired {fired}; exit {self.exit}"
        )


def launches(workdir: Path, name: str) -> list[Launch]:
    """Every launch of study `name`, from the logs its servers left in the host's workdir (a
    workdir keeps them all): the simulator's own record, one per launch, whether or not the
    tuner fetched a copy into a trial folder (a fetch the SSH relay cut loses that copy)."""
    found = []
    for log in workdir.glob(f"tuner-{name}-trial*.log"):
        index, armed, ready, fired = -1, (), False, Counter()
        for line in log.read_text(errors="replace").splitlines():
            if READY_LINE in line:
                ready = True
            if PREFIX not in line:
                continue
            words = line.split(PREFIX, 1)[1].split()
            if len(words) > 1 and words[1] == "fired":
                fired[words[0]] += 1
            elif len(words) > 1 and words[0] == "launch":  # the launch's summary: what is armed
                index = int(words[1].rstrip(":"))
                parts = line.split(PREFIX, 1)[1].split(": ", 1)[-1].split("; ")
                armed = tuple(p.split(":", 1)[0] for p in parts if " not armed " not in p)
        if ready and "slow-start" in armed:  # it logs no line: it fired if start-up finished
            fired["slow-start"] += 1
        code = Path(f"{log}.exit")
        exit_ = code.read_text().strip() if code.exists() else None
        found.append(Launch(index, armed, ready, fired, exit_))
    return sorted(found, key=lambda launch: launch.index)


def fired_kinds(found: list[Launch]) -> Counter[str]:
    """Per fault kind, how often it fired over these launches."""
    return sum((launch.fired for launch in found), Counter())


def run_soak(
    tmp: Path,
    sshd: Sshd,
    n_trials: int,
    faults: list[str],
    seed: int,
    mfs_high: float | None = None,
) -> Soak:
    """Run the clean and the faulted study side by side and check what every soak must show;
    `mfs_high`: the space's top mem-fraction-static (None: the demo's 0.98, whose CUDA-graph
    OOM at start-up ends a launch before any load fault armed on it can fire)."""
    runs = tmp / "runs"
    markers = [marker_for(n, "soak", runs / n) for n in ("clean", "chaos")]
    try:
        # side by side, so both runs share the same (busy) machine and the ratio is fair
        with Relay(sshd.port) as relay:
            relay.chaos(0.05, seed=3)  # an SSH connection cut every ~20 s
            clean_study = _study(tmp, "clean", sshd, sshd.port, n_trials, [], seed, mfs_high)
            chaos_study = _study(tmp, "chaos", sshd, relay.port, n_trials, faults, seed, mfs_high)
            t0 = time.monotonic()
            runs_ = {"clean": _tune(clean_study, runs), "chaos": _tune(chaos_study, runs)}
            done = _finish(runs_, t0)
            (clean, clean_err, clean_s), (chaos, chaos_err, chaos_s) = done["clean"], done["chaos"]
            cuts = relay.stats.cut
        assert clean == 0, clean_err[-3000:]
        assert chaos == 0, chaos_err[-3000:]

        st = _load(runs, "chaos")
        states = Counter(t.state.name for t in st.trials)
        found = launches(tmp, "chaos")
        fired = fired_kinds(found)
        print(
            f"\nclean: {clean_s:.0f} s; chaos: {chaos_s:.0f} s ({chaos_s / clean_s:.2f}x); "
            f"trials {dict(states)}; SSH cuts {cuts}; faults fired {dict(fired)}"
        )
        print("\n".join(launch.line() for launch in found))
        # every trial accounted for
        assert states["COMPLETE"] == n_trials and states.get("RUNNING", 0) == 0
        for t in st.trials:
            if t.state.name == "COMPLETE":
                assert t.user_attrs.get(Attr.STATUS), t.number
            elif t.state.name == "FAIL":
                assert t.user_attrs.get(Attr.INFRA_ERROR), t.number
                assert int(t.user_attrs.get(Attr.RETRIES, 0)) <= 2
        assert sum(fired.values()) >= 5, fired  # the faults really happened
        # no orphan, wall time bounded, the same quality of winner
        assert all(marked_groups(m) == {} for m in markers)
        assert chaos_s <= 3 * clean_s
        _, clean_best = best_trial(_load(runs, "clean"))
        _, chaos_best = best_trial(st)
        # noise: the clean winner's own spread between its runs, at least 10%
        noise = max(0.10, clean_best["spread_pct"] / 100)
        print(
            f"winner: clean {clean_best['mean']:.0f} tok/s (spread {clean_best['spread_pct']:.0f}%),"
            f" chaos {chaos_best['mean']:.0f} tok/s (spread {chaos_best['spread_pct']:.0f}%)"
        )
        assert chaos_best["mean"] >= clean_best["mean"] * (1 - 2 * noise)
        assert yaml.safe_load((runs / "chaos" / "best.yaml").read_text())["mem-fraction-static"]
        return Soak(fired, cuts)
    finally:
        for m in markers:
            kill_marked(m)
