"""A server across N pods as a LeaderWorkerSet (pure: tuner/server/kube.py `lws_manifest`,
`lws_pods`, tuner/config/kubernetes.py `nodes`).

LWS facts relied on (kubernetes-sigs/lws docs, "LeaderWorkerSet (LWS)": architecture and pod
naming; its env vars, native since v0.6.0): API leaderworkerset.x-k8s.io/v1; a group's leader
pod is `NAME-0`, its workers `NAME-0-1` ..; the controller sets LWS_LEADER_ADDRESS,
LWS_GROUP_SIZE and LWS_WORKER_INDEX in every container, which the kubelet expands in args
written `$(VAR)`.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tuner.config.kubernetes import KubernetesSection
from tuner.server.kube import (
    LWS_API,
    delete_argv,
    labels,
    lws_manifest,
    lws_pods,
    pod_manifest,
)

S = KubernetesSection(
    namespace="llm",
    image="lmsysorg/sglang:v0.5.6",
    gpus=8,
    nodes=2,
    dist_init_port=5010,
    pod_patch={"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}},
)
ARGV = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "16"]


def _set(nodes: int = 2) -> dict:
    pod = pod_manifest(S, "tuner-abc-123456", "abc", ARGV, {"NCCL_DEBUG": "INFO"}, config=True)
    return lws_manifest(pod, nodes, S.dist_init_port)


def test_the_set_has_one_group_of_n_pods_each_the_servers_pod_with_its_rank_flags() -> None:
    lws = _set(3)
    assert lws["apiVersion"] == LWS_API == "leaderworkerset.x-k8s.io/v1"
    assert lws["kind"] == "LeaderWorkerSet"
    assert lws["metadata"] == {
        "name": "tuner-abc-123456",
        "namespace": "llm",
        "labels": labels("abc"),
    }
    spec = lws["spec"]
    assert spec["replicas"] == 1
    tpl = spec["leaderWorkerTemplate"]
    assert tpl["size"] == 3 and tpl["restartPolicy"] == "None"
    for role in ("leaderTemplate", "workerTemplate"):
        t = tpl[role]
        assert t["metadata"] == {"labels": labels("abc")}  # the marker on every pod
        assert t["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]  # the patch
        (c,) = t["spec"]["containers"]
        assert c["command"] == ["python3"] and c["image"] == S.image
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}  # per pod
        assert c["args"][:6] == ARGV[1:7]
        assert c["args"][-8:] == [
            "--config",
            "/etc/tuner/sglang-config.yaml",
            "--nnodes",
            "3",
            "--node-rank",
            "$(LWS_WORKER_INDEX)",
            "--dist-init-addr",
            "$(LWS_LEADER_ADDRESS):5010",
        ]
        assert t["spec"]["volumes"][0]["secret"]["secretName"] == "tuner-abc-123456-secrets"
    # two templates, not one object twice: a patch of one later never leaks into the other
    assert tpl["leaderTemplate"] is not tpl["workerTemplate"]


def test_the_pods_are_named_as_lws_names_them_and_a_set_is_deleted_in_the_foreground() -> None:
    assert lws_pods("s", 1) == ["s-0"]
    assert lws_pods("s", 3) == ["s-0", "s-0-1", "s-0-2"]
    argv = delete_argv(S, ["leaderworkerset/s", "secret/s-secrets"], 40)
    assert "--cascade=foreground" in argv
    assert "--cascade=foreground" not in delete_argv(S, ["pod/p"], 40)


@pytest.mark.parametrize("nodes", [0, 65])
def test_nodes_out_of_range_is_refused(nodes: int) -> None:
    with pytest.raises(ValidationError, match="nodes"):
        KubernetesSection(image="x:1", nodes=nodes)
