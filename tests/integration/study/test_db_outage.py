"""The study's PostgreSQL goes away mid-study: a restart is ridden out, a database that stays
down ends the run with one line. Real `tuner tune` workers against the simulator, a private
PostgreSQL on 127.0.0.1 (tests/helpers/pg.py) stopped and started again on its port and data
dir. Every process a test starts is ended by its process group id, even when it fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.pg import _as_postgres_dying_with_us, _wait_ready, cluster, require_postgres
from tests.helpers.studies import REPO, TUNER, study_file, study_trials

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


class Postgres:
    """A test's own cluster that can be stopped (fast shutdown) and started again."""

    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid
        # the postmaster's own argv (setpriv exec'd it): -D DATA -p PORT -k DIR -c ...
        self.argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        self.data = Path(self.argv[self.argv.index("-D") + 1])
        self.port = int(self.argv[self.argv.index("-p") + 1])
        self.restarted: subprocess.Popen | None = None

    def stop(self, deadline_s: float = 20) -> None:
        os.killpg(self.pid, signal.SIGINT)  # fast shutdown: sessions are cut, as in a restart
        end = time.monotonic() + deadline_s
        while (self.data / "postmaster.pid").exists():  # removed once it is down
            assert time.monotonic() < end, "postgres did not stop"
            time.sleep(0.1)

    def start(self) -> None:
        log = self.data.parent / "postgres-restarted.log"
        with log.open("ab") as out:
            self.restarted = subprocess.Popen(
                [*_as_postgres_dying_with_us(), *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self.restarted.pid
        _wait_ready(self.port, self.restarted, log)

    def end_restarted(self) -> None:
        """The server this test started again (the fixture ends only the first one)."""
        proc = self.restarted
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@contextlib.contextmanager
def restartable_postgres() -> Iterator[Postgres]:
    initdb, server = require_postgres()
    with cluster(initdb, server) as (url, pid):
        pg = Postgres(url, pid)
        try:
            yield pg
        finally:
            pg.end_restarted()


@contextlib.contextmanager
def workers(cmds: list[list[str]]) -> Iterator[list[subprocess.Popen]]:
    """`tuner tune` processes in their own groups; SIGTERM (the tuner stops its server),
    then SIGKILL, by group id, for any still running when the test ends."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for cmd in cmds
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=10)


def tune_cmd(
    tmp: Path, worker: str, url: str, n: int, prefix: list[str] | None = None
) -> list[str]:
    (tmp / worker).mkdir()
    study = study_file(tmp / worker, name="outage", n_trials=n)
    data = yaml.safe_load(study.read_text())
    data["baseline"] = None
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    args = ["tune", str(study), "--storage", url, "--worker", worker]
    args += ["--runs-dir", str(tmp / worker / "runs"), "--no-progress"]
    return [*(prefix or TUNER), *args]


def measured(tmp: Path, worker: str) -> bool:
    """The worker has measured a trial (its metrics.json): it is mid-study, past its start."""
    return any((tmp / worker / "runs" / "outage" / "trials").glob("*/metrics.json"))


def wait_measured(tmp: Path, names: list[str], procs: list[subprocess.Popen]) -> None:
    """Until every worker measured a trial (a fixed sleep was too short on a busy machine and
    too long on an idle one); a worker that ends first fails the test."""
    end = time.monotonic() + 120
    while not all(measured(tmp, w) for w in names):
        assert all(p.poll() is None for p in procs), "a worker ended before the outage"
        assert time.monotonic() < end, "no trial measured in 120 s"
        time.sleep(0.1)


def test_two_workers_ride_out_a_postgres_restart(tmp_path: Path) -> None:
    n = 8
    names = ["host-a", "host-b"]
    with restartable_postgres() as pg:
        cmds = [tune_cmd(tmp_path, w, pg.url, n) for w in names]
        t0 = time.monotonic()
        with workers(cmds) as procs:
            wait_measured(tmp_path, names, procs)  # both workers are mid-study
            assert all(p.poll() is None for p in procs), "a worker ended before the outage"
            pg.stop()
            down_at = time.monotonic()
            time.sleep(20)
            pg.start()
            up_at = time.monotonic()
            results = [p.communicate(timeout=400) for p in procs]
            done_at = time.monotonic()
            print(
                f"\noutage: stopped at {down_at - t0:.1f} s, answering again at "
                f"{up_at - t0:.1f} s ({up_at - down_at:.1f} s down); workers done at "
                f"{done_at - t0:.1f} s"
            )
        for proc, (_, err) in zip(procs, results, strict=True):
            assert proc.returncode == 0, err[-3000:]
            assert "Traceback" not in err, err[-3000:]
            print(" | ".join(ln for ln in err.splitlines() if "database" in ln))
        trials = study_trials(Path(cmds[0][4]), pg.url)
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    assert n <= len(complete) <= n + 1  # both may finish one in the same moment
    # a trial whose creation's acknowledgement the outage lost runs nowhere and names no
    # worker (failed by the heartbeat's stale check later); none of the workers' is left
    assert not [t for t in trials if t["state"] == "RUNNING" and t.get("worker")]


#: a worker whose outage bound is 8 s: the module's bound, set before the CLI runs
SHORT_BOUND = [
    sys.executable,
    "-c",
    "import sys, tuner.study.rdb as r; r.DB_OUTAGE_S = 8; "
    "from tuner.cli import main; sys.exit(main(sys.argv[1:]))",
]


def test_a_database_that_stays_down_ends_the_worker_in_one_line(tmp_path: Path) -> None:
    with restartable_postgres() as pg:
        cmd = tune_cmd(tmp_path, "host-a", pg.url, 20, prefix=SHORT_BOUND)
        with workers([cmd]) as (proc,):
            wait_measured(tmp_path, ["host-a"], [proc])
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            pg.stop()
            down_at = time.monotonic()
            _, err = proc.communicate(timeout=120)
            took = time.monotonic() - down_at
            print(f"\nworker ended {took:.1f} s after the database went down (bound 8 s)")
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    failed = [ln for ln in err.splitlines() if ln.startswith("tuner:")]
    assert len(failed) == 1 and failed[0].startswith("tuner: failed: the study's database"), err
    assert err.rstrip().splitlines()[-1] == failed[0]  # the last word, on one line
    assert "run the same command again to resume" in failed[0]
    assert took < 8 + 30, took
