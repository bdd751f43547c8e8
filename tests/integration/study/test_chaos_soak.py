"""Chaos soak (issue 10's proof): a 40-trial study through SSH with every fault switched on.

The same study runs twice through the real sshd: once clean, once with every simulator fault
armed at seeded rates and a relay between the tuner and sshd that cuts SSH connections at
random. The faulted run must account for every trial (completed with a status and reason, or
failed with the world's reason and retried within bounds), leave no server behind, take at most
3x the clean run's wall time, and export a winner as good as the clean run's within noise.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers.procs import kill_marked, marked_groups
from tests.helpers.relay import Relay
from tests.helpers.sshd import Sshd
from tests.helpers.studies import REPO, TUNER, study_file
from tuner.outcome import Attr
from tuner.study.worklock import marker_for
from tuner.verdict.winner import best_trial

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

N_TRIALS = 40
TUNE = [*TUNER, "tune"]
FAULTS = [
    "crash-start:p=0.08",
    "hang-start:p=0.04",
    "slow-start:p=0.1,s=1",
    "crash-load:p=0.05,after=0.3",
    "hang-load:p=0.04,after=0.3,how=stop",
    "cut-stream:p=0.3,rate=0.02",
    "http-5xx:p=0.3,rate=0.01",
    "health-flap:p=0.2,rate=0.1",
]


def _study(tmp: Path, name: str, sshd: Sshd, ssh_port: int, faults: bool) -> Path:
    path = study_file(tmp, name=name, n_trials=N_TRIALS)
    data = yaml.safe_load(path.read_text())
    launch = data["target"]["launch"]
    launch[launch.index("--sim-startup-seconds") + 1] = "0.2"
    if faults:
        for spec in FAULTS:
            launch += ["--sim-fault", spec]
        launch += ["--sim-seed", "11", "--sim-fault-state", str(tmp / f"{name}.faults")]
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
    # stderr to a file: the plain progress lines of 40 trials outgrow a pipe nobody drains
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


def test_chaos_soak(tmp_path: Path, sshd_server: Sshd) -> None:
    runs = tmp_path / "runs"
    markers = [marker_for(n, "soak", runs / n) for n in ("clean", "chaos")]
    try:
        # side by side, so both runs share the same (busy) machine and the ratio is fair
        with Relay(sshd_server.port) as relay:
            relay.chaos(0.05, seed=3)  # an SSH connection cut every ~20 s
            clean_study = _study(tmp_path, "clean", sshd_server, sshd_server.port, False)
            chaos_study = _study(tmp_path, "chaos", sshd_server, relay.port, True)
            t0 = time.monotonic()
            runs_ = {"clean": _tune(clean_study, runs), "chaos": _tune(chaos_study, runs)}
            done = _finish(runs_, t0)
            (clean, clean_err, clean_s), (chaos, chaos_err, chaos_s) = done["clean"], done["chaos"]
            cuts = relay.stats.cut
        assert clean == 0, clean_err[-3000:]
        assert chaos == 0, chaos_err[-3000:]

        st = _load(runs, "chaos")
        states = Counter(t.state.name for t in st.trials)
        fired = Counter()
        for log in (runs / "chaos" / "trials").glob("*/server.log"):
            for line in log.read_text(errors="replace").splitlines():
                if "[sim-fault]" in line and " fired" in line:
                    fired[line.split("[sim-fault]")[1].split()[0]] += 1
        print(
            f"\nclean: {clean_s:.0f} s; chaos: {chaos_s:.0f} s ({chaos_s / clean_s:.2f}x); "
            f"trials {dict(states)}; SSH cuts {cuts}; faults fired {dict(fired)}"
        )
        # every trial accounted for
        assert states["COMPLETE"] == N_TRIALS and states.get("RUNNING", 0) == 0
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
    finally:
        for m in markers:
            kill_marked(m)
