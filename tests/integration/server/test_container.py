"""The server in a container: started, reached, stopped by name, found by label, classified.

A fake `docker` (tests/helpers/fake_docker.py: no daemon, the simulator as the container's
server, in a session of its own like a real container, outside the client's process group) is
put first on the PATH of the launch script and of the runtime commands through the study's
environment (`target.env` PATH), as a user would. LocalHost for speed; one test over the real
sshd. The real docker client on this machine (no daemon) checks the failure without a daemon.
Each test ends the containers it started (by their process group) and fails if any was left.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import procs
from tests.helpers.fake_docker import IMAGE, FakeDocker
from tests.helpers.net import free_port
from tests.helpers.procs import gone, kill_marked, marked_groups, own_marker
from tests.helpers.sshd import Sshd, assert_group_gone
from tests.helpers.studies import REPO, TUNER, kill9_when, phase_reached, study_file
from tuner.config.target import ContainerSection, Timeouts
from tuner.errors import InfraError, SetupError
from tuner.hosts import Host, LocalHost, SSHHost
from tuner.server.launch import LaunchSpec, build_launch
from tuner.server.lifecycle import Server
from tuner.server.runtime import ContainerRuntime
from tuner.sglang.failures import FailureClass, is_config_failure
from tuner.study.worklock import marker_for

pytestmark = pytest.mark.slow

T = Timeouts(ready_s=30, stop_s=20, port_free_s=2, gpu_free_s=5, poll_s=0.05, http_s=2)
INNER = ["python3", "-m", "sglang.launch_server"]
KEY = "sk-container-" + secrets.token_hex(8)
TOKEN = "hf_" + secrets.token_hex(12)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDocker]:
    docker = FakeDocker(tmp_path / "docker")
    yield docker
    left = docker.cleanup()
    assert not left, f"containers left running: {left}"


@pytest.fixture
def marker() -> Iterator[str]:
    with own_marker("client groups") as m:  # the docker clients carry it (containers do not)
        yield m


def boxed(host: Host, fake: FakeDocker, marker: str, image: str = IMAGE) -> Server:
    section = ContainerSection(image=image, stop_timeout_s=5)
    runtime = ContainerRuntime(host, section, {"PATH": fake.path}, marker)
    return Server(host, T, marker=marker, runtime=runtime, api_key=KEY)


def spec(fake: FakeDocker, cwd: Path, port: int, **flags: object) -> LaunchSpec:
    """The study's launch: PATH finds the runtime, HF_TOKEN is for the server (a secret)."""
    flags = {"model-path": "sim/model", "api-key": KEY, **flags}
    env = {"PATH": fake.path, "HF_TOKEN": TOKEN}
    return build_launch(INNER, flags, port, env=env, cwd=str(cwd))


def health(port: int) -> int | None:
    return procs.health(f"http://127.0.0.1:{port}")


def test_a_server_in_a_container_is_reached_and_stopped_by_name(
    tmp_path: Path, fake: FakeDocker, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    server = boxed(host, fake, marker)
    port = free_port()
    log = tmp_path / "s.log"
    res = server.restart(spec(fake, tmp_path, port), str(log))
    assert res.ok, res
    assert health(port) == 200
    name = server.runtime.name
    (run,) = [c for c in fake.calls() if c[0] == "run"]
    config = f"{log}.secrets.yaml"
    assert run[:5] == ["run", "--name", name, "--label", f"tuner.marker={marker}"]
    assert ["-v", f"{config}:{config}:ro"] == run[run.index("-v") : run.index("-v") + 2]
    assert run[run.index(IMAGE) + 1 : run.index(IMAGE) + 4] == INNER
    assert run[-2:] == ["--config", config]  # SGLang reads the secret flags from the mount
    assert not (tmp_path / config).exists()  # and the file is gone once the server is up
    # the server's environment enters by name; the host's PATH (it finds docker) stays outside
    assert [run[i + 1] for i, a in enumerate(run) if a == "-e"] == ["HF_TOKEN"]
    assert "HF_TOKEN" in fake.records()[name]["env"]
    assert not [c for c in fake.calls() if any(KEY in a or TOKEN in a for a in c)]
    # the container's processes are outside the client's group: the group kill cannot reach it
    sim = fake.pids(name)
    assert sim and not set(sim) & set(host.group_pids(res.pgid))

    assert server.stop() > 0
    calls = fake.calls()
    assert ["stop", "-t", "5", name] in calls and ["rm", "-f", name] in calls
    assert fake.records() == {}
    assert gone(sim)
    assert host.port_free(port)
    assert_group_gone(res.pgid)
    assert server.pgid is None
    assert KEY not in log.read_text()  # the client's log is the server log: masked
    assert "api_key" in log.read_text()  # (SGLang logs its server_args, the key included)


def test_a_container_whose_client_was_killed_is_found_by_its_label(
    tmp_path: Path, fake: FakeDocker, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    port = free_port()
    first = boxed(host, fake, marker)
    res = first.restart(spec(fake, tmp_path, port), str(tmp_path / "a.log"))
    assert res.ok, res
    os.killpg(res.pgid, signal.SIGKILL)  # the client (and the tuner that knew it) gone
    assert_group_gone(res.pgid)
    assert health(port) == 200  # like docker: the container does not notice
    assert fake.running() == [first.runtime.name]
    sim = fake.pids(first.runtime.name)

    fresh = boxed(host, fake, marker)  # a later run: never saw the client
    assert fresh.stop_strays() == []  # no client group is left to report
    listed = ["ps", "-a", "--filter", f"label=tuner.marker={marker}", "--format", "{{.Names}}"]
    assert listed in fake.calls()
    assert fake.records() == {} and gone(sim) and host.port_free(port)
    # another worker's label is not ours
    assert boxed(host, fake, marker + "-other").stop_strays() == []


def test_a_container_whose_server_fails_is_the_configurations_failure(
    tmp_path: Path, fake: FakeDocker, marker: str
) -> None:
    host = LocalHost(command_timeout_s=20.0)
    server = boxed(host, fake, marker)
    port = free_port()
    res = server.restart(
        spec(fake, tmp_path, port, **{"mem-fraction-static": 0.1}), str(tmp_path / "f.log")
    )
    assert not res.ok
    assert res.failure == FailureClass.NOT_ENOUGH_MEMORY and is_config_failure(res.failure)
    assert "Not enough memory. Please try to increase --mem-fraction-static" in res.reason
    assert res.exit_code == 137  # the container's, through the client
    assert ["rm", "-f", server.runtime.name] in fake.calls() and fake.records() == {}
    assert server.pgid is None


def test_a_dead_container_without_its_client_log_is_read_from_the_runtime(
    tmp_path: Path, fake: FakeDocker, marker: str
) -> None:
    """The client's log and exit file are gone: `inspect` and `logs` give the evidence."""
    host = LocalHost(command_timeout_s=20.0)
    server = boxed(host, fake, marker)
    name = server.runtime.name
    argv = ["docker", "run", "--name", name, "--label", f"tuner.marker={marker}", IMAGE, *INNER]
    argv += ["--model-path", "m", "--port", str(free_port()), "--mem-fraction-static", "0.1"]
    client = subprocess.Popen(
        argv,
        env={**os.environ, "PATH": fake.path},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert client.wait(60) == 137
    assert fake.records()[name]["status"] == "exited"  # no --rm: kept for its evidence
    server.adopt(client.pid, "docker run", str(tmp_path / "gone.log"), 1)
    assert not host.group_alive(client.pid)
    death = server.check()
    assert death is not None and death.exit_code == 137
    assert death.failure == FailureClass.NOT_ENOUGH_MEMORY, death
    server.stop()
    assert fake.records() == {}


def test_setup_mistakes_stop_the_study(tmp_path: Path, fake: FakeDocker, marker: str) -> None:
    host = LocalHost(command_timeout_s=20.0)
    port = free_port()
    wrong = boxed(host, fake, marker, image="lmsysorg/sglang:nope")
    with pytest.raises(SetupError) as err:
        wrong.restart(spec(fake, tmp_path, port), str(tmp_path / "i.log"))
    msg = str(err.value)
    assert msg.startswith("target.container: docker cannot run the container on local (exit 125)")
    assert "pull access denied" in msg and "\n" not in msg
    assert fake.records() == {}

    missing = Server(
        host,
        T,
        marker=marker,
        runtime=ContainerRuntime(host, ContainerSection(image=IMAGE), {"PATH": "/nonexistent"}),
    )
    before = len(fake.calls())
    with pytest.raises(SetupError, match=r"^target.container.runtime: docker is not on the PATH"):
        missing.restart(spec(fake, tmp_path, port), str(tmp_path / "m.log"))
    assert len(fake.calls()) == before and missing.pgid is None  # nothing spawned


def test_the_real_docker_client_without_a_daemon(tmp_path: Path, marker: str) -> None:
    """The real client parses every command the tuner builds; no daemon is the user's setup
    at start and the world's failure when stopping (never a silent success)."""
    real = subprocess.run(["bash", "-c", "command -v docker"], capture_output=True, text=True)
    if real.returncode != 0:
        pytest.skip("no docker client on this machine")
    sock = f"unix://{tmp_path}/no-daemon.sock"
    host = LocalHost(command_timeout_s=20.0)
    env = {"DOCKER_HOST": sock}
    runtime = ContainerRuntime(host, ContainerSection(image=IMAGE, stop_timeout_s=1), env, marker)
    server = Server(host, T, marker=marker, runtime=runtime)
    launch = build_launch(INNER, {"model-path": "m"}, free_port(), env=env, cwd=str(tmp_path))
    with pytest.raises(
        SetupError, match=r"exit 125\): docker: Cannot connect to the Docker daemon"
    ):
        server.restart(launch, str(tmp_path / "r.log"))
    with pytest.raises(InfraError, match="cannot list containers: Cannot connect"):
        server.stop_strays()
    with pytest.raises(InfraError, match="cannot remove container"):
        runtime.remove(lambda: ())


@pytest.mark.ssh
def test_a_container_over_ssh(
    tmp_path: Path, fake: FakeDocker, marker: str, sshd_server: Sshd
) -> None:
    host = SSHHost(sshd_server.options())
    try:
        server = boxed(host, fake, marker)
        port = free_port()
        res = server.restart(spec(fake, tmp_path, port), str(tmp_path / "ssh.log"))
        assert res.ok, res
        assert health(port) == 200 and fake.running() == [server.runtime.name]
        server.stop()
        assert fake.records() == {} and LocalHost().port_free(port)
    finally:
        host.close()


def test_resume_after_kill_9_stops_the_leftover_container(tmp_path: Path, fake: FakeDocker) -> None:
    """`tuner tune` killed -9 mid-load, its docker client too: the rerun removes the orphaned
    container by its label before anything else, finishes, and leaves no container behind."""
    (tmp_path / "wd").mkdir()
    study = study_file(
        tmp_path,
        name="boxed",
        n_trials=1,  # trial 0 (SGLang's defaults) is killed in its load and run again
        baseline=None,
        budget__concurrency_probes=0,
        budget__confirm_top=0,
    )
    data = yaml.safe_load(study.read_text())
    # inside the container; the fake runs the simulator for it. Not the default `python3 -m
    # sglang.launch_server`: `tuner tune`'s flag check runs the launch's `--help` on the host
    data["target"]["launch"] = [sys.executable, "-m", "tuner.sim"]
    data["target"]["env"] = {"PATH": fake.path}
    data["target"]["workdir"] = str(tmp_path / "wd")
    data["target"]["container"] = {"image": IMAGE, "stop_timeout_s": 5}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = tmp_path / "runs"
    argv = [*TUNER, "tune", str(study), "--runs-dir", str(runs)]
    argv += ["--worker", "w", "--no-progress"]
    marker = marker_for("boxed", "w", runs / "boxed")
    err = tmp_path / "first.err"
    try:
        kill9_when(argv, err, lambda: fake.running() and phase_reached(runs, "load"), "load phase")
        kill_marked(marker)  # its docker client too: only the label finds the container now
        (left,) = fake.running()
        sim = fake.pids(left)
        assert sim and marked_groups(marker) == {}
        assert health(data["target"]["port"]) == 200  # orphaned, serving, holding its "GPU"

        t0 = len(fake.calls())
        final = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-2000:]
        calls = fake.calls()[t0:]
        first_run = next(i for i, c in enumerate(calls) if c[0] == "run")
        assert ["rm", "-f", left] in calls[:first_run]  # removed before the next start
        assert gone(sim)
        assert fake.running() == [] and fake.records() == {}  # the last one too, at the end
        assert marked_groups(marker) == {}
        assert (runs / "boxed" / "best.yaml").exists()
    finally:
        kill_marked(marker)
