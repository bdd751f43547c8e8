"""The pod's manifests, kubectl's command lines, what a pod's status means, and the
`target.kubernetes` section (pure: tuner/server/kube.py, tuner/server/kubefollow.py,
tuner/config/kubernetes.py).

The manifests are checked for what the runtime relies on (the worker's label, the launch and
flags as the container's command and args, the GPU request, secrets only by reference), the
patch for its documented merge rules, the status reader against pods as the API server writes
them (Unschedulable, Evicted, a lost node, a bad image), and the section for one-line errors.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.helpers.studies import study_dict
from tuner.config.kubernetes import KubernetesSection
from tuner.config.load import parse_study
from tuner.errors import ConfigError
from tuner.server.kube import (
    create_argv,
    delete_argv,
    env_split,
    gpu_nodes,
    items,
    list_argv,
    marker_tag,
    merge_patch,
    nodes_argv,
    pod_manifest,
    pod_name,
    port_forward_argv,
    secret_manifest,
    shell,
)
from tuner.server.kubefollow import main as follow_main
from tuner.server.kubefollow import pod_view
from tuner.server.launch import build_launch

S = KubernetesSection(
    namespace="llm",
    image="lmsysorg/sglang:v0.5.6",
    gpus=8,
    node_selector={"nvidia.com/gpu.product": "H100"},
    context="prod",
)


def test_names_and_labels_follow_the_marker() -> None:
    tag = marker_tag("tuner-abc")
    assert tag == marker_tag("tuner-abc") != marker_tag("tuner-abd") and len(tag) == 10
    assert marker_tag(None) != marker_tag(None)  # random without a marker
    a, b = pod_name("tuner", tag), pod_name("tuner", tag)
    assert a != b and a.startswith(f"tuner-{tag}-") and len(a) <= 63


def test_the_pod_runs_the_launch_with_the_flags_the_gpus_and_secrets_by_reference() -> None:
    spec = build_launch(
        ["python3", "-m", "sglang.launch_server"],
        {"model-path": "/models/x", "api-key": "sk-secret-1234", "tp-size": 8},
        30000,
        env={"PATH": "/bin", "HF_TOKEN": "hf-secret-5678", "NCCL_DEBUG": "INFO"},
    )
    plain, hidden = env_split(spec.env)
    assert plain == {"NCCL_DEBUG": "INFO"} and hidden == {"HF_TOKEN": "hf-secret-5678"}
    pod = pod_manifest(
        S, "tuner-t-1", "t", spec.argv, plain, secret_keys=sorted(hidden), config=True
    )
    assert pod["metadata"] == {
        "name": "tuner-t-1",
        "namespace": "llm",
        "labels": {"app.kubernetes.io/managed-by": "tuner", "tuner/marker": "t"},
    }
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python3"] and c["image"] == S.image
    assert (
        c["args"]
        == [
            *spec.argv[1:],
            "--config",
            "/etc/tuner/sglang-config.yaml",
        ]
        and "--tensor-parallel-size" in c["args"]
    )
    assert c["resources"] == {
        "limits": {"nvidia.com/gpu": "8"},
        "requests": {"nvidia.com/gpu": "8"},
    }
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["spec"]["volumes"][0]["secret"]["secretName"] == "tuner-t-1-secrets"
    ref = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "tuner-t-1-secrets", "key": "HF_TOKEN"}
    text = json.dumps(pod)
    assert "sk-secret-1234" not in text and "hf-secret-5678" not in text
    secret = secret_manifest(
        S, "tuner-t-1", "t", {**hidden, "sglang-config.yaml": spec.secrets_yaml()}
    )
    assert secret["metadata"]["labels"]["tuner/marker"] == "t"
    assert "sk-secret-1234" in secret["stringData"]["sglang-config.yaml"]
    cpu = KubernetesSection(image="x", gpus=0)  # no GPU asked, no volume without secret flags
    bare = pod_manifest(cpu, "p", "t", ["python3", "-m", "tuner.sim"], {})
    assert "resources" not in bare["spec"]["containers"][0] and "volumes" not in bare["spec"]


def test_a_pod_patch_merges_by_the_documented_rules() -> None:
    base = {
        "metadata": {"labels": {"a": "1"}},
        "spec": {
            "containers": [{"name": "sglang", "env": [{"name": "X", "value": "1"}]}],
            "tolerations": [{"key": "old"}],
            "dnsPolicy": "ClusterFirst",
        },
    }
    patch = {
        "metadata": {"labels": {"team": "llm"}, "annotations": {"k": "v"}},
        "spec": {
            "containers": [
                {"name": "sglang", "env": [{"name": "Y", "value": "2"}], "workingDir": "/w"},
                {"name": "sidecar", "image": "busybox"},
            ],
            "tolerations": [{"key": "new"}],  # not named: replaced
            "dnsPolicy": None,  # null: removed
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": None}}],
        },
    }
    out = merge_patch(base, patch)
    assert out["metadata"] == {"labels": {"a": "1", "team": "llm"}, "annotations": {"k": "v"}}
    sglang, sidecar = out["spec"]["containers"]
    assert sglang["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert sglang["workingDir"] == "/w" and sidecar == {"name": "sidecar", "image": "busybox"}
    assert out["spec"]["tolerations"] == [{"key": "new"}] and "dnsPolicy" not in out["spec"]
    assert out["spec"]["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    assert base["spec"]["tolerations"] == [{"key": "old"}]  # the inputs are not changed


def test_kubectl_command_lines() -> None:
    assert create_argv(S) == [
        "kubectl", "--context", "prod", "--namespace", "llm", "create", "-f", "-", "-o", "name"
    ]  # fmt: skip
    assert list_argv(S, "t", "pods,secrets")[-6:] == [
        "get",
        "pods,secrets",
        "-l",
        "tuner/marker=t",
        "-o",
        "json",
    ]
    assert delete_argv(S, ["pod/p", "secret/p-secrets"], 40)[-5:] == [
        "pod/p", "secret/p-secrets", "--ignore-not-found", "--wait=true", "--timeout=40s"
    ]  # fmt: skip
    assert port_forward_argv(S, "p", 4321, 30000)[-4:] == [
        "--address",
        "127.0.0.1",
        "pod/p",
        "4321:30000",
    ]
    assert nodes_argv(S)[-5:] == ["nodes", "-l", "nvidia.com/gpu.product=H100", "-o", "json"]
    assert "--namespace" not in nodes_argv(S)  # nodes are the cluster's
    odd = ["kubectl", "--context", "a b;rm -rf /"]
    assert shlex.split(shell(odd)) == odd


def _pod(**status: object) -> dict:
    return {"status": status}


def test_pod_status_tells_pending_running_ended_and_whose_failure() -> None:
    pending = pod_view(
        _pod(
            phase="Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
        )
    )
    assert not pending.scheduled and not pending.started and pending.world is None
    assert (
        pending.pending_why
        == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    running = pod_view(
        _pod(
            phase="Running",
            conditions=[{"type": "PodScheduled", "status": "True"}],
            containerStatuses=[{"name": "sglang", "state": {"running": {}}}],
        )
    )
    assert running.scheduled and running.started and running.exit_code is None
    oom = pod_view(
        _pod(
            phase="Failed",
            containerStatuses=[
                {"name": "sglang", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
            ],
        )
    )
    assert oom.exit_code == 1 and oom.world is None  # the server's own exit: its log decides
    evicted = pod_view(
        _pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    )
    assert evicted.world == "Evicted: The node was low on resource: memory."
    preempted = pod_view(
        _pod(
            phase="Running",
            conditions=[
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
        )
    )
    assert preempted.world == "PreemptionByScheduler"
    lost = pod_view(
        _pod(
            phase="Failed",
            containerStatuses=[
                {
                    "name": "sglang",
                    "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}},
                }
            ],
        )
    )
    assert lost.world and "ContainerStatusUnknown" in lost.world
    assert pod_view(_pod(phase="Unknown")).world

    def pull(reason: str, message: str):
        state = {"waiting": {"reason": reason, "message": message}}
        return pod_view(
            _pod(phase="Pending", containerStatuses=[{"name": "sglang", "state": state}])
        )

    refused = pull("ErrImagePull", "pull access denied for x, repository does not exist")
    assert refused.setup and refused.setup.startswith("ErrImagePull: pull access denied")
    assert pull("ErrImagePull", "dial tcp: i/o timeout").setup is None  # the registry's: waited
    assert pull("ImagePullBackOff", 'Back-off pulling image "x"').setup is None
    assert pull("InvalidImageName", "bad").setup == "InvalidImageName: bad"
    assert pull("ContainerCreating", "").waiting == "ContainerCreating"
    creating = pod_view(
        _pod(
            phase="Pending",
            containerStatuses=[
                {"name": "sglang", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        )
    )
    assert creating.setup is None and not creating.started


def test_node_lists_and_their_gpus() -> None:
    text = json.dumps(
        {
            "kind": "List",
            "items": [
                {"metadata": {"name": "a"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
                {"metadata": {"name": "b"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
                {
                    "metadata": {"name": "c"},
                    "spec": {"unschedulable": True},
                    "status": {"allocatable": {"nvidia.com/gpu": "8"}},
                },
                {"metadata": {"name": "d"}, "status": {"allocatable": {"cpu": "8"}}},
            ],
        }
    )
    assert gpu_nodes(items(text), "nvidia.com/gpu") == [("b", 8), ("a", 4), ("d", 0)]
    assert items("not json") == [] and items('{"kind": "Pod", "a": 1}') == [{"kind": "Pod", "a": 1}]


def test_the_follower_ignores_the_config_argument_the_launch_script_appends(monkeypatch) -> None:
    seen = {}
    monkeypatch.setattr(
        "tuner.server.kubefollow.follow", lambda k, p, s: seen.update(k=k, p=p, s=s) or 7
    )
    argv = ["--kubectl", '["kubectl", "-n", "x"]', "--pod", "p1", "--poll", "0.5"]
    assert follow_main([*argv, "--config", "/tmp/x.secrets.yaml"]) == 7
    assert seen == {"k": ["kubectl", "-n", "x"], "p": "p1", "s": 0.5}


def _study(**kube: object) -> dict:
    return study_dict(
        target={
            "host": "local",
            "launch": ["python3", "-m", "sglang.launch_server"],
            "kubernetes": {"image": "lmsysorg/sglang:x", **kube},
        }
    )


@pytest.mark.parametrize(
    ("kube", "target", "server", "key", "said"),
    [
        ({"gpus": -1}, {}, {}, "target.kubernetes.gpus", "greater than or equal to 0"),
        ({"namespace": "Bad_NS"}, {}, {}, "target.kubernetes.namespace", "lower-case letters"),
        ({"gpu_resource": "gpu"}, {}, {}, "target.kubernetes.gpu_resource", "extended resource"),
        ({"node_selector": {"a b": "c"}}, {}, {}, "target.kubernetes.node_selector", "label key"),
        (
            {"schedule_timeout_s": 0},
            {},
            {},
            "target.kubernetes.schedule_timeout_s",
            "greater than 0",
        ),
        ({"bogus": 1}, {}, {}, "target.kubernetes.bogus", ""),
        (
            {"pod_patch": {"spec": {"restartPolicy": "Always"}}},
            {},
            {},
            "target.kubernetes.pod_patch",
            "spec.restartPolicy is not allowed",
        ),
        (
            {"pod_patch": {"spec": {"containers": [{"name": "sglang", "image": "x"}]}}},
            {},
            {},
            "target.kubernetes.pod_patch",
            "use target.kubernetes.image",
        ),
        (
            {"pod_patch": {"metadata": {"labels": {"tuner/marker": "x"}}}},
            {},
            {},
            "target.kubernetes.pod_patch",
            "tuner's own labels",
        ),
        (
            {},
            {"slurm": {"partition": "gpu", "gpus": 1, "time": "1h"}},
            {},
            "target.kubernetes",
            "target.slurm",
        ),
        ({}, {"container": {"image": "x"}}, {}, "target.kubernetes", "target.container"),
        ({}, {"host": "gpu-box"}, {}, "target.host", "kubectl runs where the tuner runs"),
        ({}, {"gpus": "0,1"}, {}, "target.gpus", "target.kubernetes.gpus"),
        ({}, {"workdir": "/w"}, {}, "target.workdir", "remove it"),
        ({}, {"launch": ["{python}", "-m", "tuner.sim"]}, {}, "target.launch", "inside the image"),
        ({}, {}, {"nnodes": 2}, "server.nnodes", "target.nodes"),
        ({}, {}, {"host": "gpu-node"}, "server.host", "port-forward"),
    ],
)
def test_bad_kubernetes_input_names_its_key(
    kube: dict, target: dict, server: dict, key: str, said: str
) -> None:
    data = _study(**kube)
    data["target"].update(target)
    data["server"].update(server)
    with pytest.raises(ConfigError) as err:
        parse_study(data, "s.yaml")
    text = str(err.value)
    assert f"{key}:" in text and said in text and "\n" not in text, text


def test_a_good_section_parses_with_its_defaults() -> None:
    cfg = parse_study(_study(node_selector={"gpu": "h100"}), "s.yaml")
    k = cfg.target.kubernetes
    assert k is not None and k.namespace == "default" and k.gpus == 1
    assert k.gpu_resource == "nvidia.com/gpu" and k.schedule_timeout_s == 600
