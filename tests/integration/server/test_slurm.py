"""The server as a step of a Slurm allocation: allocated, launched, reached, stopped, found after
a kill, and Slurm's own endings judged as the world's.

Fake Slurm commands (tests/helpers/fake_slurm.py: `salloc`, `srun`, `squeue`, `scancel`,
`sinfo`, state in a temp dir) are put first on the PATH of the launch script and of every
Slurm command through the study's environment (`target.env` PATH), as a user would. The
"node" is this machine at 127.0.0.1 (loopback only); `srun` runs the simulated SGLang server
as a real process in a session of its own, outside srun's group, as a task on a compute node
is. Each test ends the tasks it caused (by their process group) and fails if any was left.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.fake_slurm import FakeSlurm
from tests.helpers.net import free_port
from tests.helpers.procs import gone, health, kill_marked, marked_groups, own_marker
from tests.helpers.sshd import Sshd, assert_group_gone
from tests.helpers.studies import REPO, TUNER, kill9_when, phase_reached, study_file, tuner
from tuner.check.lines import FAIL, OK
from tuner.check.plan import run_checks
from tuner.config.slurm import SlurmSection
from tuner.config.target import Timeouts
from tuner.errors import InfraError, SetupError
from tuner.hosts import Host, LocalHost, SSHHost
from tuner.server.endpoint import DirectEndpoint, TunnelEndpoint
from tuner.server.launch import LaunchSpec, build_launch
from tuner.server.lifecycle import Server
from tuner.server.steps import SlurmEndpoint, SlurmRuntime
from tuner.sglang.failures import is_config_failure
from tuner.study.worklock import marker_for

pytestmark = pytest.mark.slow

T = Timeouts(ready_s=30, stop_s=10, port_free_s=2, gpu_free_s=5, poll_s=0.05, http_s=2)
SIM = [sys.executable, "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"]
KEY = "sk-slurm-" + secrets.token_hex(8)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSlurm]:
    slurm = FakeSlurm(tmp_path / "slurm")
    yield slurm
    left = slurm.cleanup()
    assert not left, f"Slurm tasks left running: {left}"


@pytest.fixture
def marker() -> Iterator[str]:
    with own_marker(
        "srun groups"
    ) as m:  # the srun clients carry it (the tasks, on the "node", do not)
        yield m


def section(**over: object) -> SlurmSection:
    return SlurmSection(
        **{"partition": "gpu", "gpus": 1, "time": "1h", "poll_s": 0.1, "pending_s": 20, **over}
    )


def stepped(
    host: Host, fake: FakeSlurm, marker: str, workdir: Path, **over: object
) -> tuple[Server, SlurmRuntime]:
    runtime = SlurmRuntime(host, section(**over), {"PATH": fake.path}, marker, str(workdir), T)
    make = (
        (lambda node: TunnelEndpoint(host, remote_host=node))
        if isinstance(host, SSHHost)
        else DirectEndpoint
    )
    endpoint = SlurmEndpoint(runtime.allocation, make)
    server = Server(host, T, endpoint=endpoint, marker=marker, runtime=runtime, api_key=KEY)
    return server, runtime


def spec(fake: FakeSlurm, cwd: Path, port: int, **flags: object) -> LaunchSpec:
    flags = {"model-path": "sim/model", "host": "127.0.0.1", "api-key": KEY, **flags}
    launch = [*SIM, "--sim-startup-seconds", "0"]
    return build_launch(launch, flags, port, env={"PATH": fake.path}, cwd=str(cwd))


def only(calls: list[list[str]], cmd: str) -> list[list[str]]:
    return [c for c in calls if c[0] == cmd]


def test_a_server_runs_as_a_step_is_reached_on_the_node_and_stopped(
    tmp_path: Path, fake: FakeSlurm, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    server, runtime = stepped(host, fake, marker, tmp_path)
    port = free_port()
    log = tmp_path / "s.log"
    res = server.restart(spec(fake, tmp_path, port), str(log))
    assert res.ok, res
    (job,) = fake.jobs().values()
    assert job["name"] == runtime.name and job["state"] == "RUNNING"
    (salloc,) = only(fake.calls(), "salloc")
    assert salloc[:3] == ["salloc", "--no-shell", f"--job-name={runtime.name}"]
    (srun,) = only(fake.calls(), "srun")
    assert srun[1:3] == [f"--jobid={job['id']}", f"--job-name={runtime.step}"]
    assert srun[srun.index("tuner.sim") - 2] == sys.executable  # the server's argv, after srun's
    assert srun[-2:] == ["--config", f"{log}.secrets.yaml"]
    assert not [c for c in fake.calls() if any(KEY in a for a in c)]  # never on a command line
    assert server.endpoint.url(port) == f"http://127.0.0.1:{port}"  # the allocation's node
    assert health(server.endpoint.url(port)) == 200
    (step,) = fake.running_steps()
    task = fake.task_pids(step)
    assert task and not set(task) & set(host.group_pids(res.pgid))  # on the "node"

    assert server.stop() > 0
    assert fake.running_steps() == [] and gone(task) and host.port_free(port)
    assert_group_gone(res.pgid)
    assert KEY not in log.read_text()  # srun's output is the server log: masked
    runtime.release()
    assert fake.jobs()[job["id"]]["state"] == "CANCELLED"
    assert only(fake.calls(), "scancel")[-1] == ["scancel", job["id"]]  # by id, never by name


def test_a_step_whose_srun_was_killed_is_cancelled_by_its_id(
    tmp_path: Path, fake: FakeSlurm, marker: str
) -> None:
    """srun gone (killed -9): the step runs on; the record's stop cancels it, and a later run
    that never saw it finds it by its name, then reuses the allocation."""
    host = LocalHost(command_timeout_s=20.0)
    server, runtime = stepped(host, fake, marker, tmp_path)
    port = free_port()
    res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "a.log"))
    assert res.ok, res
    os.killpg(res.pgid, signal.SIGKILL)
    assert_group_gone(res.pgid)
    (step,) = fake.running_steps()
    assert health(server.endpoint.url(port)) == 200  # like Slurm: the step does not notice
    server.stop()  # the client's group is gone: the step is cancelled by its id
    assert ["scancel", step] in fake.calls() and fake.running_steps() == []

    res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "b.log"))
    assert res.ok, res
    os.killpg(res.pgid, signal.SIGKILL)  # the tuner and its srun gone
    (stray,) = fake.running_steps()
    task = fake.task_pids(stray)

    later, again = stepped(host, fake, marker, tmp_path)  # a later run: never saw the step
    assert later.stop_strays() == []  # no srun group left to report
    assert ["scancel", stray] in fake.calls() and fake.running_steps() == [] and gone(task)
    res = later.restart(spec(fake, tmp_path, port), str(tmp_path / "c.log"))
    assert res.ok, res
    assert len(only(fake.calls(), "salloc")) == 1  # the allocation held since the first start
    assert again.allocation.job is not None and again.allocation.job.id == stray.split(".")[0]
    later.stop()
    again.release()
    # another worker's steps and allocation are not ours
    other, _ = stepped(host, fake, marker + "-other", tmp_path)
    assert other.stop_strays() == []


def test_an_allocation_pending_past_its_deadline_is_the_worlds_failure(
    tmp_path: Path, marker: str
) -> None:
    fake = FakeSlurm(tmp_path / "slurm", grant=False, reason="QOSMaxGRESPerUser")
    host = LocalHost(command_timeout_s=20.0)
    server, runtime = stepped(host, fake, marker, tmp_path, pending_s=1.0)
    log = tmp_path / "p.log"
    try:
        t0 = time.monotonic()
        with pytest.raises(InfraError) as err:
            server.restart(spec(fake, tmp_path, free_port()), str(log))
        assert time.monotonic() - t0 < 10
        msg = str(err.value)
        assert "not running after 1 s (target.slurm.pending_s)" in msg, msg
        assert "PENDING (QOSMaxGRESPerUser)" in msg and "request cancelled" in msg
        (job,) = fake.jobs().values()
        assert job["state"] == "CANCELLED" and only(fake.calls(), "srun") == []
        assert not Path(f"{log}.secrets.yaml").exists()  # the API key's file never stays
        assert server.pgid is None and runtime.allocation.job is None
    finally:
        assert fake.cleanup() == []  # salloc withdrew its request and ended


def test_a_node_failure_is_the_worlds_failure_and_the_next_start_gets_a_new_allocation(
    tmp_path: Path, fake: FakeSlurm, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    server, runtime = stepped(host, fake, marker, tmp_path)
    port = free_port()
    res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "n.log"))
    assert res.ok, res
    first = runtime.allocation.job
    assert first is not None
    fake.fail_node(first.id)
    deadline = time.monotonic() + 20
    while host.group_alive(res.pgid):  # srun notices its task died with the node
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(InfraError, match=r"Slurm ended the server's step .*Node failure on"):
        server.check()
    death = server.check()  # said once: then an ordinary death, never the flags' fault
    assert death is not None and not is_config_failure(death.failure)

    res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "n2.log"))
    assert res.ok, res
    second = runtime.allocation.job
    assert second is not None and second.id != first.id
    assert len(only(fake.calls(), "salloc")) == 2
    server.stop()
    runtime.release()


def test_salloc_refusing_the_request_is_the_users_setup(
    tmp_path: Path, fake: FakeSlurm, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    server, _ = stepped(host, fake, marker, tmp_path, partition="gpux")
    with pytest.raises(SetupError) as err:
        server.restart(spec(fake, tmp_path, free_port()), str(tmp_path / "r.log"))
    msg = str(err.value)
    assert msg.startswith("target.slurm: salloc refused the allocation on local: ")
    assert "Invalid partition name specified" in msg and "\n" not in msg
    missing = Server(
        host,
        T,
        marker=marker,
        runtime=SlurmRuntime(host, section(), {"PATH": "/nonexistent"}, marker, str(tmp_path), T),
    )
    before = len(fake.calls())
    with pytest.raises(SetupError, match=r"^target.slurm: salloc, srun, squeue, scancel not on"):
        missing.restart(spec(fake, tmp_path, free_port()), str(tmp_path / "m.log"))
    assert len(fake.calls()) == before and missing.pgid is None


@pytest.mark.ssh
def test_a_step_over_ssh_through_the_login_node(
    tmp_path: Path, fake: FakeSlurm, marker: str, sshd_server: Sshd
) -> None:
    host = SSHHost(sshd_server.options())
    try:
        server, runtime = stepped(host, fake, marker, tmp_path)
        port = free_port()
        res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "ssh.log"))
        assert res.ok, res
        url = server.endpoint.url(port)
        assert url != f"http://127.0.0.1:{port}" and health(url) == 200  # forwarded to the node
        assert "(node 127.0.0.1)" in server.endpoint.describe(port)
        server.stop()
        runtime.release()
        assert fake.running_steps() == [] and LocalHost().port_free(port)
    finally:
        server.endpoint.close()
        host.close()


# --- the study file and tuner check ----------------------------------------------------------


def slurm_study(tmp_path: Path, fake: FakeSlurm, name: str, **slurm: object) -> Path:
    study = study_file(
        tmp_path,
        name=name,
        n_trials=1,  # trial 0 (SGLang's defaults) is killed in its load and run again
        baseline=None,
        budget__concurrency_probes=0,
        budget__confirm_top=0,
    )
    data = yaml.safe_load(study.read_text())
    data["target"]["env"] = {"PATH": fake.path}
    data["target"]["workdir"] = str(tmp_path / "wd")
    data["target"]["slurm"] = {
        "partition": "gpu",
        "gpus": 1,
        "time": "01:00:00",
        "poll_s": 0.1,
        "pending_s": 30,
        **slurm,
    }
    data["server"]["host"] = "127.0.0.1"
    (tmp_path / "wd").mkdir(exist_ok=True)
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    return study


def test_bad_slurm_input_is_one_line_and_exit_2(tmp_path: Path, fake: FakeSlurm) -> None:
    study = slurm_study(tmp_path, fake, "bad", time=43200)
    out = tuner("tune", str(study), "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "target.slurm.time: expected a walltime" in lines[0], lines
    assert not (tmp_path / "runs").exists() and fake.calls() == []


def test_check_says_whether_slurm_and_the_partition_are_there(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    lines = {x.name: x for x in run_checks(slurm_study(tmp_path, fake, "chk"))}
    assert lines["slurm"].status == OK, lines["slurm"]
    assert "salloc, srun, squeue, scancel on the PATH" in lines["slurm"].detail
    assert "slurm 24.05.0-fake" in lines["slurm"].detail
    assert lines["partition"].status == OK and "gpu: up, 1 node" in lines["partition"].detail
    assert "allocation's node" in lines["port"].detail  # not probed on the login node
    bad = {x.name: x for x in run_checks(slurm_study(tmp_path, fake, "chk2", partition="gpux"))}
    assert bad["partition"].status == FAIL
    assert "no partition gpux" in bad["partition"].detail and "gpu" in bad["partition"].detail
    assert only(fake.calls(), "salloc") == []  # check asks for nothing


def test_a_night_whose_allocation_stays_pending_stops_with_slurms_reason(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "slurm", grant=False, reason="Priority")
    try:
        study = slurm_study(tmp_path, fake, "queued", pending_s=1)
        out = tuner("tune", str(study), "--runs-dir", str(tmp_path / "runs"), "--no-progress")
        assert out.returncode == 1, out.stderr
        (line,) = [x for x in out.stderr.splitlines() if x.startswith("tuner: ")]
        assert line.startswith("tuner: stopped: ") and "PENDING (Priority)" in line, line
        assert "request cancelled" in line and "run the same command again" in line
        assert "Slurm: holding allocation" in out.stdout + out.stderr
        (job,) = fake.jobs().values()
        assert job["state"] == "CANCELLED" and only(fake.calls(), "srun") == []
    finally:
        assert fake.cleanup() == []


def test_resume_after_kill_9_stops_the_stray_step_and_reuses_the_allocation(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    """`tuner tune` killed -9 mid-load, its srun too: the rerun cancels the orphaned step (found
    by its name) before anything else, runs in the same allocation, and gives it back."""
    study = slurm_study(tmp_path, fake, "slurmy")
    runs = tmp_path / "runs"
    argv = [*TUNER, "tune", str(study), "--runs-dir", str(runs), "--worker", "w", "--no-progress"]
    marker = marker_for("slurmy", "w", runs / "slurmy")
    port = yaml.safe_load(study.read_text())["target"]["port"]
    err = tmp_path / "first.err"
    try:
        kill9_when(
            argv, err, lambda: fake.running_steps() and phase_reached(runs, "load"), "load phase"
        )
        kill_marked(marker)  # its srun too: only the step's name finds the server now
        (stray,) = fake.running_steps()
        task = fake.task_pids(stray)
        assert task and marked_groups(marker) == {}
        assert health(f"http://127.0.0.1:{port}") == 200  # orphaned, serving, holding its GPUs
        (job,) = fake.jobs().values()
        assert job["state"] == "RUNNING"

        t0 = len(fake.calls())
        final = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-2000:]
        calls = fake.calls()[t0:]
        first_srun = next(i for i, c in enumerate(calls) if c[0] == "srun")
        assert ["scancel", stray] in calls[:first_srun]  # cancelled before the next start
        assert calls[first_srun][1] == f"--jobid={job['id']}"  # in the same allocation
        assert only(calls, "salloc") == []
        assert gone(task) and fake.running_steps() == []
        assert fake.jobs()[job["id"]]["state"] == "CANCELLED"  # given back at the end
        assert calls[-1] == ["scancel", job["id"]]
        assert marked_groups(marker) == {}
        assert (runs / "slurmy" / "best.yaml").exists()
    finally:
        kill_marked(marker)
