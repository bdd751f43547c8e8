"""The container's command lines and its study-file section (pure: tuner/server/container.py).

The argv builders are checked for shape (name, label, mounts, `-e NAME` never with a value, the
secrets file mounted read-only, the inner argv after the image) and for quoting through the
launch script. Where this machine has a real docker client, every command line is also parsed by
it (against a socket with no daemon: a parse error would be "unknown flag", exit 125).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from tuner.config.load import parse_study
from tuner.config.schema import parse_schema
from tuner.config.target import ContainerSection, mount_problem, target_problem
from tuner.errors import ConfigError
from tuner.server.container import (
    DEFAULT_LAUNCH,
    container_name,
    list_argv,
    logs_argv,
    parse_names,
    parse_pids,
    parse_state,
    pids_argv,
    probe_argv,
    rm_argv,
    run_argv,
    setup_problem,
    state_argv,
    stop_argv,
    wrap,
)
from tuner.server.launch import build_launch
from tuner.server.target import Launch

S = ContainerSection(image="lmsysorg/sglang:v0.5.6", mounts=["/data/models:/models:ro"])


def test_run_argv_names_labels_mounts_and_passes_env_by_name() -> None:
    argv = run_argv(
        S,
        "tuner-abc",
        "tuner-m1",
        ["python3", "-m", "sglang.launch_server", "--x"],
        ["HF_TOKEN", "CUDA_VISIBLE_DEVICES"],
        "/w/t.log.secrets.yaml",
    )
    assert argv == [
        "docker", "run", "--name", "tuner-abc", "--label", "tuner.marker=tuner-m1",
        "--gpus", "all", "--ipc", "host", "--network", "host",
        "-v", "/data/models:/models:ro",
        "-v", "/w/t.log.secrets.yaml:/w/t.log.secrets.yaml:ro",
        "-e", "HF_TOKEN", "-e", "CUDA_VISIBLE_DEVICES",
        "lmsysorg/sglang:v0.5.6", "python3", "-m", "sglang.launch_server", "--x",
    ]  # fmt: skip
    assert "--rm" not in argv and "-d" not in argv  # attached; removed by the tuner
    assert run_argv(S, "n", None, ["x"])[:4] == ["docker", "run", "--name", "n"]  # no label
    with pytest.raises(ValueError, match="cannot bind-mount"):
        run_argv(S, "n", None, ["x"], config_path="/a:b/s.yaml")


def test_wrap_keeps_secrets_off_the_command_line_and_quotes_every_value() -> None:
    spec = build_launch(
        ["python3", "-m", "sglang.launch_server"],
        {"model-path": "/models/it's here", "api-key": "sk-secret-1234"},
        30000,
        env={"PATH": "/opt/docker/bin:/usr/bin", "HF_TOKEN": "hf_secret_5678"},
    )
    boxed = wrap(spec, S, "tuner-abc", "tuner-m1", "/w/s.yaml")
    assert boxed.port == 30000 and boxed.env == spec.env and boxed.flags == spec.flags
    env_names = [boxed.argv[i + 1] for i, a in enumerate(boxed.argv) if a == "-e"]
    assert env_names == ["HF_TOKEN"]  # by name; PATH (finds docker on the host) stays out
    script = boxed.script("/w/s.yaml")
    exec_line = script.splitlines()[-1]
    assert exec_line.startswith("exec docker run --name tuner-abc ")
    assert shlex.split(exec_line.removeprefix("exec "))[-2:] == ["--config", "/w/s.yaml"]
    assert "'/models/it'\"'\"'s here'" in exec_line  # shlex-quoted
    assert "sk-secret-1234" not in exec_line and "hf_secret_5678" not in exec_line
    assert "export HF_TOKEN=hf_secret_5678" in script  # the client's environment, from the file
    only = ContainerSection(image="img", env=["CUDA_VISIBLE_DEVICES"])
    assert [a for a in wrap(spec, only, "n", None).argv if a.isupper()] == ["CUDA_VISIBLE_DEVICES"]


def test_stop_list_logs_inspect_top_commands() -> None:
    assert stop_argv(S, "tuner-abc") == ["docker", "stop", "-t", "30", "tuner-abc"]
    assert rm_argv(S, "tuner-abc") == ["docker", "rm", "-f", "tuner-abc"]
    assert list_argv(S, "tuner-m1") == [
        "docker", "ps", "-a", "--filter", "label=tuner.marker=tuner-m1", "--format", "{{.Names}}"
    ]  # fmt: skip
    assert logs_argv(S, "n", 40) == ["docker", "logs", "--tail", "40", "n"]
    assert state_argv(S, "n")[:4] == ["docker", "container", "inspect", "-f"]
    assert pids_argv(S, "n") == ["docker", "top", "n", "-o", "pid"]
    probe = probe_argv(S, ["python3", "-m", "sglang.launch_server", "--help"], ["HF_TOKEN"])
    assert probe[:3] == ["docker", "run", "--rm"] and probe[-5:-3] == [S.image, "python3"]
    assert "--name" not in probe and probe[-7:-5] == ["-e", "HF_TOKEN"]
    pod = ContainerSection(runtime="podman", image="img")
    assert pids_argv(pod, "n") == ["podman", "top", "n", "hpid"]
    assert stop_argv(pod, "n")[0] == "podman"


def test_parsing_the_runtimes_answers() -> None:
    assert parse_state("running 0\n") == ("running", None)
    assert parse_state("exited 137") == ("exited", 137)
    assert parse_state("") is None and parse_state("Error: x") is None
    assert parse_pids("PID\n1234\n5678\n") == [1234, 5678]
    assert parse_pids("HPID\n42") == [42]
    assert parse_names("tuner-a\ntuner-b\n\nWARNING: x y\n") == ["tuner-a", "tuner-b"]


def test_container_names() -> None:
    a = container_name("tuner", "tuner-m1")
    assert a == container_name("tuner", "tuner-m1") != container_name("tuner", "tuner-m2")
    assert a.startswith("tuner-") and len(a) == len("tuner-") + 12
    assert container_name("t", None) != container_name("t", None)  # random without a marker


def test_setup_problem_reads_the_runtimes_refusal() -> None:
    tail = [
        "Unable to find image 'x:y' locally",
        "docker: Error response from daemon: pull access denied for x, repository does not exist",
        "Run 'docker run --help' for more information",
    ]
    assert setup_problem("docker", 125, tail) == tail[1]
    assert setup_problem("docker", 1, tail) is None  # the server's own exit: not the runtime's
    conflict = ['docker: Error response from daemon: Conflict. The container name "/t" is ...']
    assert setup_problem("docker", 125, conflict) is None  # our leftover: the world's
    assert setup_problem("docker", 125, []) == "docker run exited 125"


def _study(tmp_path: Path, **target: object) -> dict:
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["target"] = {**{k: v for k, v in data["target"].items() if k != "launch"}, **target}
    return data


@pytest.mark.parametrize(
    ("container", "key", "message"),
    [
        ({}, "target.container.image", "required key is missing"),
        ({"image": "img", "mounts": ["models:/m", "/a:b"]}, "target.container.mounts", "SRC:DST"),
        ({"image": "img", "mounts": ["/a:/b:rx"]}, "target.container.mounts", "ro, rw, z or Z"),
        ({"image": "img", "run_options": ["--rm"]}, "target.container.run_options", "removes"),
        ({"image": "img", "run_options": ["--name=x"]}, "target.container.run_options", "names"),
        ({"image": "img", "run_options": ["-d"]}, "target.container.run_options", "attached"),
        ({"image": "img", "name_prefix": "-x"}, "target.container.name_prefix", "container name"),
        ({"image": "img", "name_prefix": "a b"}, "target.container.name_prefix", "container name"),
        ({"image": "img", "runtime": "lxc"}, "target.container.runtime", "docker"),
        ({"image": "img", "env": ["A-B"]}, "target.container.env", "variable name"),
        ({"image": "-x"}, "target.container.image", "image reference"),
        ({"image": "img", "bogus": 1}, "target.container.bogus", "unknown key"),
    ],
)
def test_bad_container_sections_name_their_key(
    tmp_path: Path, container: dict, key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_schema(_study(tmp_path, container=container), "s.yaml")
    text = str(err.value)
    assert text.startswith(f"s.yaml: {key}: ") and message in text and "\n" not in text


def test_the_launch_is_the_command_inside_the_container(tmp_path: Path) -> None:
    cfg = parse_schema(_study(tmp_path, container={"image": "img"}, gpus="0,1"), "s.yaml")
    launch = Launch.of(cfg.target)
    assert launch.template == DEFAULT_LAUNCH  # the image's python3, not the tuner's Python
    assert launch.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    given = parse_schema(_study(tmp_path, container={"image": "img"}, launch=["sglang", "serve"]))
    assert Launch.of(given.target).template == ("sglang", "serve")
    assert Launch.of(parse_schema(_study(tmp_path)).target).template[0] != "python3"


@pytest.mark.parametrize(
    ("target", "key", "message"),
    [
        ({"launch": ["{python}", "-m", "tuner.sim"]}, "target.launch", "not one inside the image"),
        ({"workdir": "/srv/a:b"}, "target.workdir", "cannot be bind-mounted"),
    ],
)
def test_what_cannot_work_in_a_container_is_refused(
    tmp_path: Path, target: dict, key: str, message: str
) -> None:
    data = _study(tmp_path, container={"image": "img"}, **target)
    with pytest.raises(ConfigError) as err:
        parse_study(data, "s.yaml")
    assert str(err.value).startswith(f"s.yaml: {key}: ") and message in str(err.value)
    assert parse_study(_study(tmp_path, container={"image": "img"}), "s.yaml").target.container
    assert target_problem(["python3"], "/srv/ok") == ("target.container", None)
    assert mount_problem("hf-cache:/root/.cache/huggingface") is None


_REAL = shutil.which("docker")


@pytest.mark.skipif(_REAL is None, reason="no docker client on this machine")
def test_the_real_docker_client_parses_every_command_line(tmp_path: Path) -> None:
    """A parse error is 'unknown flag'/'requires' and exit 125; a valid command gets as far as
    the (missing) daemon."""
    env = {"DOCKER_HOST": f"unix://{tmp_path}/none.sock", "PATH": "/usr/bin:/bin"}
    inner = [*DEFAULT_LAUNCH, "--model-path", "/models/m", "--port", "30000"]
    for argv in (
        run_argv(S, "tuner-abc", "tuner-m1", inner, ["HF_TOKEN"], "/w/s.yaml"),
        stop_argv(S, "tuner-abc"),
        rm_argv(S, "tuner-abc"),
        state_argv(S, "tuner-abc"),
        list_argv(S, "tuner-m1"),
        logs_argv(S, "tuner-abc", 40),
        pids_argv(S, "tuner-abc"),
        probe_argv(S, [*DEFAULT_LAUNCH, "--help"], ["HF_TOKEN"]),
    ):
        res = subprocess.run([_REAL, *argv[1:]], env=env, capture_output=True, text=True)
        assert "Cannot connect to the Docker daemon" in res.stderr, (argv, res.stderr)
    bad = subprocess.run([_REAL, "run", "--bogus", "img"], env=env, capture_output=True, text=True)
    assert bad.returncode == 125 and "unknown flag" in bad.stderr  # the check can fail
