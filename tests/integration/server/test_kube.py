"""The server as a Kubernetes pod: created, reached through `kubectl port-forward`, deleted,
found by its label after a kill, and the cluster's own endings judged as the world's.

Proven against a fake `kubectl` only (tests/helpers/fake_kubectl.py: state in a temp dir, the
simulator as each pod's process on this machine, port-forward a real TCP relay on 127.0.0.1),
put first on the PATH of every kubectl call through the study's environment (`target.env`
PATH), as a user would. Each test ends the pod processes it caused (by their process group)
and fails if any was left.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.fake_kubectl import IMAGE, FakeKubectl, node
from tests.helpers.net import free_port
from tests.helpers.procs import gone, health, kill_marked, marked_groups, own_marker
from tests.helpers.sshd import assert_group_gone
from tests.helpers.studies import REPO, TUNER, kill9_when, phase_reached, study_file, tuner
from tuner.check.lines import FAIL, OK, WARN
from tuner.check.plan import run_checks
from tuner.config.kubernetes import KubernetesSection
from tuner.config.target import Timeouts
from tuner.errors import InfraError, SetupError
from tuner.hosts import LocalHost
from tuner.server.kubeforward import KubeEndpoint
from tuner.server.kuberuntime import KubeRuntime
from tuner.server.launch import LaunchSpec, build_launch
from tuner.server.lifecycle import Server
from tuner.sglang.failures import is_config_failure
from tuner.study.worklock import marker_for

pytestmark = pytest.mark.slow

T = Timeouts(ready_s=30, stop_s=10, port_free_s=2, gpu_free_s=5, poll_s=0.05, http_s=2)
LAUNCH = ["python3", "-m", "sglang.launch_server"]
KEY = "sk-kube-" + secrets.token_hex(8)
#: the simulator in each pod, starting at once (the server-level tests restart it often)
FAST = ("--sim-profile", "llama-3.1-8b-h100", "--sim-startup-seconds", "0")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeKubectl]:
    kube = FakeKubectl(tmp_path / "kube", sim_args=FAST)
    yield kube
    left = kube.cleanup()
    assert not left, f"pod processes left running: {left}"


@pytest.fixture
def marker() -> Iterator[str]:
    with own_marker("groups") as m:  # the followers and port-forwards carry it (the pods do not)
        yield m


def section(**over: object) -> KubernetesSection:
    return KubernetesSection(**{"image": IMAGE, "poll_s": 0.1, "grace_period_s": 5, **over})


def podded(
    fake: FakeKubectl, marker: str, **over: object
) -> tuple[Server, KubeRuntime, KubeEndpoint]:
    host = LocalHost(command_timeout_s=20.0)
    runtime = KubeRuntime(host, section(**over), {"PATH": fake.path}, marker, T)
    endpoint = KubeEndpoint(runtime)
    server = Server(host, T, endpoint=endpoint, marker=marker, runtime=runtime, api_key=KEY)
    return server, runtime, endpoint


def spec(fake: FakeKubectl, port: int, **flags: object) -> LaunchSpec:
    flags = {"model-path": "sim/model", "api-key": KEY, **flags}
    env = {"PATH": fake.path, "HF_TOKEN": "hf-" + KEY, "SGLANG_LOG_LEVEL": "info"}
    return build_launch(LAUNCH, flags, port, env=env)


def verbs(fake: FakeKubectl) -> list[str]:
    """The kubectl subcommand of every call (global flags dropped)."""
    out = []
    for argv in fake.calls():
        words = [
            a
            for i, a in enumerate(argv)
            if not a.startswith("-") and (i == 0 or not argv[i - 1].startswith("--"))
        ]
        out.append(words[0] if words else "")
    return out


def test_a_server_runs_as_a_pod_is_reached_by_port_forward_and_deleted(
    tmp_path: Path, fake: FakeKubectl, marker: str
) -> None:
    server, runtime, endpoint = podded(fake, marker)
    port = free_port()
    log = tmp_path / "s.log"
    try:
        res = server.restart(spec(fake, port), str(log))
        assert res.ok, res
        (name,) = fake.pods()
        pod = fake.pods()[name]
        assert pod["metadata"]["labels"]["tuner/marker"] == runtime.tag
        (c,) = pod["spec"]["containers"]
        assert c["image"] == IMAGE and c["command"] == ["python3"]
        assert c["args"][:2] == ["-m", "sglang.launch_server"] and f"{port}" in c["args"]
        assert c["args"][-2:] == ["--config", "/etc/tuner/sglang-config.yaml"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        # the key: never on a command line, in the pod's spec, or in a plain env value
        assert KEY not in json.dumps(pod) and not [a for a in fake.calls() if KEY in " ".join(a)]
        (secret,) = fake.secrets().values()
        assert KEY in secret["stringData"]["sglang-config.yaml"]
        assert secret["stringData"]["HF_TOKEN"] == "hf-" + KEY
        assert {"name": "SGLANG_LOG_LEVEL", "value": "info"} in c["env"]
        assert not [e for e in c["env"] if e["name"] == "PATH"]  # the tuner's, not the pod's
        url = endpoint.url(port)
        assert url != f"http://127.0.0.1:{port}" and health(url) == 200  # through the relay
        assert "port-forward" in verbs(fake)
        task = fake.pod_pids(name)
        assert task and not set(task) & set(server.host.group_pids(res.pgid))

        assert server.stop() > 0
        assert fake.pods() == {} and fake.secrets() == {} and gone(task)
        assert_group_gone(res.pgid)
        assert KEY not in log.read_text()  # the follower's copy of the log: masked
        assert runtime.pod is None
    finally:
        endpoint.close()


def test_a_killed_runs_pod_is_found_by_its_label_and_deleted(
    tmp_path: Path, fake: FakeKubectl, marker: str
) -> None:
    """The tuner and its follower killed -9: the pod runs on; another worker's run leaves it,
    a later run of this worker that never saw it deletes it (and its Secret) by the label."""
    server, _, endpoint = podded(fake, marker)
    try:
        res = server.restart(spec(fake, free_port()), str(tmp_path / "a.log"))
        assert res.ok, res
    finally:
        endpoint.close()
    kill_marked(marker)  # the follower, as with the tuner's death
    assert_group_gone(res.pgid)
    (stray,) = fake.pods()
    task = fake.pod_pids(stray)
    assert task and fake.pods()[stray]["status"]["phase"] == "Running"
    other, _, _ = podded(fake, marker + "-other")
    assert other.stop_strays() == [] and list(fake.pods()) == [stray]  # not its pod
    later, _, _ = podded(fake, marker)  # a later run: never saw the pod
    assert later.stop_strays() == []
    assert fake.pods() == {} and fake.secrets() == {} and gone(task)


def test_a_pod_pending_past_its_deadline_is_the_worlds_failure_with_the_reason(
    tmp_path: Path, fake: FakeKubectl, marker: str
) -> None:
    server, runtime, endpoint = podded(fake, marker, gpus=2, schedule_timeout_s=1.0)
    log = tmp_path / "p.log"
    try:
        t0 = time.monotonic()
        with pytest.raises(InfraError) as err:
            server.restart(spec(fake, free_port()), str(log))
        assert time.monotonic() - t0 < 10
        msg = str(err.value)
        assert "not scheduled within 1 s (target.kubernetes.schedule_timeout_s)" in msg, msg
        assert "Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in msg
        assert "the world's failure" in msg and "pod deleted" in msg
        assert fake.pods() == {} and fake.secrets() == {}  # deleted, the Secret too
        assert not Path(f"{log}.secrets.yaml").exists()  # the API key's file never stays
        assert server.pgid is None and runtime.pod is None
    finally:
        endpoint.close()


def test_an_evicted_pod_is_the_worlds_failure_and_an_oom_the_configurations(
    tmp_path: Path, fake: FakeKubectl, marker: str
) -> None:
    server, _, endpoint = podded(fake, marker)
    port = free_port()
    try:
        res = server.restart(spec(fake, port), str(tmp_path / "e.log"))
        assert res.ok, res
        (name,) = fake.pods()
        fake.evict(name)
        deadline = time.monotonic() + 20
        while server.host.group_alive(res.pgid):  # the follower sees the pod end
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(InfraError, match=r"cluster ended the server's pod: Evicted: The node"):
            server.check()
        death = server.check()  # said once: then an ordinary death, never the flags' fault
        assert death is not None and not is_config_failure(death.failure)
        server.stop()
        assert fake.pods() == {}

        # SGLang's own refusal in the pod's log: the configuration's, as anywhere
        res = server.restart(
            spec(fake, port, **{"mem-fraction-static": 0.99}), str(tmp_path / "o.log")
        )
        assert not res.ok and is_config_failure(res.failure), res
        assert fake.pods() == {}  # deleted once its log and exit code were read
    finally:
        endpoint.close()


def test_an_image_that_cannot_be_pulled_is_the_users_setup(
    tmp_path: Path, fake: FakeKubectl, marker: str
) -> None:
    server, _, endpoint = podded(fake, marker, image="lmsysorg/sglang:typo")
    try:
        with pytest.raises(
            SetupError, match=r"^target.kubernetes: the pod cannot start: ErrImagePull"
        ):
            server.restart(spec(fake, free_port()), str(tmp_path / "i.log"))
        assert fake.pods() == {}
        bad, _, endpoint2 = podded(fake, marker, namespace="nope")
        with pytest.raises(SetupError, match=r'namespace nope: .*namespaces "nope" not found'):
            bad.restart(spec(fake, free_port()), str(tmp_path / "n.log"))
        endpoint2.close()
    finally:
        endpoint.close()


# --- the study file, tuner check and tuner tune -------------------------------------------------


def kube_study(tmp_path: Path, fake: FakeKubectl, name: str, **kube: object) -> Path:
    study = study_file(
        tmp_path,
        name=name,
        n_trials=1,
        baseline=None,
        budget__concurrency_probes=0,
        budget__confirm_top=0,
    )
    data = yaml.safe_load(study.read_text())
    data["target"].pop("workdir")
    data["target"]["launch"] = LAUNCH
    data["target"]["env"] = {"PATH": fake.path}
    data["target"]["kubernetes"] = {"image": IMAGE, "poll_s": 0.1, "grace_period_s": 5, **kube}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    return study


def test_bad_kubernetes_input_is_one_line_and_exit_2(tmp_path: Path, fake: FakeKubectl) -> None:
    """One of the section's mistakes through the CLI (the rest: tests/unit/server/test_kube_manifest.py)."""
    study = kube_study(tmp_path, fake, "bad", pod_patch={"spec": {"restartPolicy": "Always"}})
    out = tuner("tune", str(study), "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "target.kubernetes.pod_patch: " in lines[0], lines
    assert "spec.restartPolicy is not allowed" in lines[0]
    assert not (tmp_path / "runs").exists() and fake.calls() == []


#: the checks the later runs of the check test need (the connection's first: it opens the host)
KEYS = ("ssh", "shell", "kubectl", "namespace", "gpu nodes")


def test_check_says_whether_the_cluster_can_hold_the_pod(tmp_path: Path) -> None:
    fake = FakeKubectl(
        tmp_path / "kube",
        nodes=[node("a100", 4, {"gpu": "a100"}), node("h100", 8, {"gpu": "h100"})],
        denied=("create pods/portforward",),
    )
    lines = {
        x.name: x
        for x in run_checks(
            kube_study(tmp_path, fake, "chk", gpus=8, node_selector={"gpu": "h100"})
        )
    }
    assert lines["kubectl"].status == OK and "v1.31.0-fake" in lines["kubectl"].detail
    assert lines["namespace"].status == OK and "default" in lines["namespace"].detail
    assert (
        lines["pod rights"].status == FAIL
        and "create pods/portforward" in lines["pod rights"].detail
    )
    assert (
        lines["gpu nodes"].status == OK and "h100 (8 nvidia.com/gpu)" in lines["gpu nodes"].detail
    )
    assert lines["port"].status == "skip" and "pod" in lines["port"].detail
    more = {
        x.name: x
        for x in run_checks(
            kube_study(tmp_path, fake, "chk2", gpus=16, namespace="nope"), keys=KEYS
        )
    }
    assert more["namespace"].status == FAIL and "nope" in more["namespace"].detail
    assert more["gpu nodes"].status == "skip"
    few = {x.name: x for x in run_checks(kube_study(tmp_path, fake, "chk3", gpus=16), keys=KEYS)}
    assert few["gpu nodes"].status == FAIL and "at most 8" in few["gpu nodes"].detail
    assert not [c for c in fake.calls() if "-f" in c]  # check creates nothing
    blind = FakeKubectl(tmp_path / "kube2", denied=("list nodes",))
    hidden = {x.name: x for x in run_checks(kube_study(tmp_path, blind, "chk4"), keys=KEYS)}
    assert hidden["gpu nodes"].status == WARN and "cannot list nodes" in hidden["gpu nodes"].detail


def test_resume_after_kill_9_deletes_the_stray_pod_by_its_label(
    tmp_path: Path, fake: FakeKubectl
) -> None:
    """`tuner tune` killed -9 mid-trial: its pod, its follower and its port-forward live on
    (the last two in sessions of their own); the rerun deletes the pod (found by the worker's
    label) before its first create, stops the two by their marker, and finishes."""
    study = kube_study(tmp_path, fake, "kubey")
    data = yaml.safe_load(study.read_text())
    data["workload"]["duration_s"] = 1.5  # the rerun's one trial: its load is not the point
    data["objective"]["slo"]["p99_ttft_ms"] = 1000
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = tmp_path / "runs"
    argv = [*TUNER, "tune", str(study), "--runs-dir", str(runs), "--worker", "w", "--no-progress"]
    marker = marker_for("kubey", "w", runs / "kubey")
    err = tmp_path / "first.err"
    try:
        kill9_when(
            argv, err, lambda: phase_reached(runs, "warmup"), "warm-up"
        )  # its pod ready and serving
        (stray,) = fake.pods()
        task = fake.pod_pids(stray)
        left = marked_groups(
            marker
        )  # pgid -> a command of the group: the follower's, the forward's
        assert task and len(left) == 2 and "port-forward" in " ".join(left.values()), left

        t0 = len(fake.calls())
        final = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-2000:]
        calls = fake.calls()[t0:]
        first_create = next(i for i, c in enumerate(calls) if "-f" in c)
        before = [" ".join(c) for c in calls[:first_create]]
        listed = next(i for i, c in enumerate(before) if "get pods,secrets -l tuner/marker=" in c)
        assert any(f"delete pod/{stray} " in c for c in before[listed:])
        assert gone(task) and fake.pods() == {} and fake.secrets() == {}
        assert marked_groups(marker) == {}
        assert (runs / "kubey" / "best.yaml").exists()
    finally:
        kill_marked(marker)


def test_a_server_across_two_pods_is_a_leaderworkerset_reached_at_its_leader(
    tmp_path: Path, marker: str
) -> None:
    """target.kubernetes.nodes: 2: the two fake pods meet at the leader's rendezvous port
    (the simulator's torch.distributed store), the leader is reached through the forward,
    and stopping deletes the set and both pods."""
    fake = FakeKubectl(tmp_path / "kube", nodes=[node("gpu-1"), node("gpu-2")], sim_args=FAST)
    dist = free_port()
    server, runtime, endpoint = podded(fake, marker, nodes=2, dist_init_port=dist)
    port = free_port()
    try:
        res = server.restart(spec(fake, port, **{"tp-size": 2}), str(tmp_path / "s.log"))
        assert res.ok, res
        lws = runtime.lws
        assert lws is not None and sorted(fake.pods()) == [f"{lws}-0", f"{lws}-0-1"]
        assert runtime.pod == f"{lws}-0"
        leader = fake.pods()[f"{lws}-0"]
        assert leader["metadata"]["labels"]["tuner/marker"] == runtime.tag
        assert leader["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert {p["spec"]["nodeName"] for p in fake.pods().values()} == {"gpu-1", "gpu-2"}
        assert health(endpoint.url(port)) == 200
        assert (
            "Init torch distributed ends." in (fake.state / "pods" / f"{lws}-0-1.log").read_text()
        )
        argv = json.loads((fake.state / "pods" / f"{lws}-0-1.json").read_text())["argv"]
        at = argv.index("--node-rank")
        assert argv[at : at + 4] == ["--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{dist}"]
        tasks = [pid for name in fake.pods() for pid in fake.pod_pids(name)]

        assert server.stop() > 0
        assert fake.pods() == {} and fake.secrets() == {} and gone(tasks)
        assert not list((fake.state / "lws").glob("*.json")) and runtime.lws is None
    finally:
        endpoint.close()
        left = fake.cleanup()
        assert not left, f"pod processes left running: {left}"
