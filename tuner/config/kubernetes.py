"""The study file's `target.kubernetes:`: one pod per server (the manifests and the kubectl
command lines it implies are built in `server/kube.py`). Pure.

    target:
      host: local                  # kubectl runs where the tuner runs
      api_key_env: SGLANG_API_KEY  # optional: reaches the pod as a Secret, never in its spec
      kubernetes:
        namespace: llm-tuning
        image: lmsysorg/sglang:v0.5.6.post2-cu126
        gpus: 8                    # resources.limits["nvidia.com/gpu"]
        node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
        context: prod-cluster      # optional: kubectl --context
        schedule_timeout_s: 30m    # Pending longer: the world's failure, with the scheduler's reason
        pod_patch:                 # deep-merged into the pod the tuner writes (see docs/kubernetes.md)
          spec:
            tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
            containers: [{name: sglang, volumeMounts: [{name: models, mountPath: /models}]}]
            volumes: [{name: models, persistentVolumeClaim: {claimName: models}}]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from tuner.config.base import Duration, Model, image_reference

#: a DNS-1123 label: a namespace, a name prefix
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: a label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")
#: an extended resource name: a domain prefix, `/`, a name (nvidia.com/gpu, amd.com/gpu)
RESOURCE_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
#: the name of the server's container in the pod (a patch addresses it by this name)
CONTAINER = "sglang"

#: what a pod_patch may not set: the tuner owns it (why, for the one-line error)
_OWNED_TOP = {
    "apiVersion": "the tuner writes a v1 Pod",
    "kind": "the tuner writes a v1 Pod",
    "status": "the cluster's, not the tuner's",
}
_OWNED_META = {
    "name": "the tuner names each pod (name_prefix) to find it again",
    "namespace": "use target.kubernetes.namespace",
    "generateName": "the tuner names each pod (name_prefix) to find it again",
}
_OWNED_SPEC = {
    "restartPolicy": "Never: a server that exits is judged, not restarted by the kubelet",
    "nodeSelector": "use target.kubernetes.node_selector",
    "nodeName": "the scheduler places the pod (use node_selector)",
}
_OWNED_CONTAINER = {
    "image": "use target.kubernetes.image",
    "command": "the command is target.launch",
    "args": "the arguments are the trial's flags",
}


class KubernetesSection(Model):
    """`target.kubernetes`: each server one pod, created, reached by `kubectl port-forward`,
    deleted."""

    namespace: str = "default"
    image: str
    #: GPUs each pod asks for (requests = limits of `gpu_resource`); 0: none (a CPU image)
    gpus: int = Field(1, ge=0, le=1024)
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = Field(default_factory=dict)
    #: deep-merged into the pod the tuner generates (rules: `server.kube.merge_patch`)
    pod_patch: dict[str, Any] = Field(default_factory=dict)
    kubectl: str = "kubectl"  # the program: a name on the PATH or a path
    context: str | None = None  # kubectl --context (default: the kubeconfig's current)
    name_prefix: str = "tuner"  # pods are PREFIX-<10 hex of the worker's marker>-<6 hex>
    #: a pod not scheduled within this is the world's failure with the scheduler's reason
    schedule_timeout_s: Duration = 600
    #: terminationGracePeriodSeconds: SIGTERM, then SIGKILL, when the pod is deleted
    grace_period_s: int = Field(30, ge=0, le=3600)
    #: one kubectl call (create, get, delete's own wait is grace_period_s more)
    command_timeout_s: Duration = 60
    #: the longest wait between two looks at a pod (scheduling, deletion, the follower)
    poll_s: Duration = 2
    #: pods per server: N > 1 makes each server a LeaderWorkerSet of N pods (one SGLang over
    #: them: --nnodes N --node-rank $(LWS_WORKER_INDEX), server/kube.py `lws_manifest`)
    nodes: int = Field(1, ge=1, le=64)
    #: the leader pod's port of the ranks' rendezvous (--dist-init-addr LEADER:PORT)
    dist_init_port: int = Field(5000, ge=1, le=65535)

    @field_validator("namespace", "name_prefix")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not DNS_LABEL_RE.match(v) or len(v) > 40:
            raise ValueError(
                f"{v!r}: lower-case letters, digits and '-', starting and ending with a letter "
                "or digit, at most 40 characters"
            )
        return v

    _image = field_validator("image")(image_reference)

    @field_validator("gpu_resource")
    @classmethod
    def _resource(cls, v: str) -> str:
        if not RESOURCE_RE.match(v):
            raise ValueError(f"{v!r} is not an extended resource name such as nvidia.com/gpu")
        return v

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not LABEL_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a label key")
            if not LABEL_VALUE_RE.match(value):
                raise ValueError(f"{key}: {value!r} is not a label value (63 characters at most)")
        return v

    @field_validator("kubectl", "context")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError(f"{v!r}: expected one word (a program, a context name)")
        return v

    @field_validator("pod_patch")
    @classmethod
    def _patch(cls, v: dict[str, Any]) -> dict[str, Any]:
        problem = patch_problem(v)
        if problem:
            raise ValueError(problem)
        return v


def patch_problem(patch: Mapping[str, Any]) -> str | None:
    """Why `pod_patch` cannot be merged into the tuner's pod (a field the tuner owns, a shape
    that is not a Pod's), or None."""
    for key, why in _OWNED_TOP.items():
        if key in patch:
            return f"{key} is not allowed: {why}"
    unknown = sorted(set(patch) - {"metadata", "spec"})
    if unknown:
        return f"{unknown[0]}: a pod_patch holds metadata: and spec: only"
    meta, spec = patch.get("metadata") or {}, patch.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return "metadata and spec must be mappings"
    for key, why in _OWNED_META.items():
        if key in meta:
            return f"metadata.{key} is not allowed: {why}"
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        return "metadata.labels must be a mapping"
    for key in labels:
        if str(key).startswith("tuner/"):
            return f"metadata.labels.{key} is not allowed: the tuner's own labels find its pods"
    for key, why in _OWNED_SPEC.items():
        if key in spec:
            return f"spec.{key} is not allowed: {why}"
    containers = spec.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        return "spec.containers must be a list of mappings (each with a name)"
    for c in containers:
        if "name" not in c:
            return "spec.containers: each entry needs a name (the server's is sglang)"
        if c["name"] == CONTAINER:
            for key, why in _OWNED_CONTAINER.items():
                if key in c:
                    return f"spec.containers[{CONTAINER}].{key} is not allowed: {why}"
    return None


def kubernetes_problem(target: Any, server: Mapping[str, object]) -> tuple[str, str | None]:
    """(key, why not) when the rest of the study (`target`: its TargetSection, untyped here:
    config.target imports this module) cannot run with `target.kubernetes`, else
    ("target.kubernetes", None)."""
    if target.slurm is not None:
        return "target.kubernetes", "cannot be combined with target.slurm: choose one scheduler"
    if target.container is not None:
        return "target.kubernetes", (
            "cannot be combined with target.container: the pod is the container "
            "(target.kubernetes.image)"
        )
    if target.host != "local":
        return "target.host", (
            "with target.kubernetes kubectl runs where the tuner runs: remove it (host: local); "
            "the cluster is the one of your kubeconfig (target.kubernetes.context)"
        )
    for key, why in (
        ("gpus", "the pod asks for target.kubernetes.gpus GPUs"),
        ("http_host", "the tuner reaches the pod through kubectl port-forward"),
        ("workdir", "the server runs in the image (a working directory: pod_patch workingDir)"),
    ):
        if getattr(target, key):
            return f"target.{key}", f"with target.kubernetes {why}; remove it"
    if "{python}" in target.launch:
        return "target.launch", (
            "{python} is the tuner's own Python, not one inside the image; name it (python3)"
        )
    if "host" in server and server["host"] not in ("127.0.0.1", "localhost", "0.0.0.0"):
        return "server.host", (
            "with target.kubernetes the server is reached inside its pod (port-forward): leave "
            "it out, or 127.0.0.1 / 0.0.0.0"
        )
    for key in ("nnodes", "node-rank", "dist-init-addr"):
        if key in server:
            return f"server.{key}", (
                "with target.kubernetes the tuner sets it: a server spanning pods is "
                "target.kubernetes.nodes (a LeaderWorkerSet, docs/kubernetes.md)"
            )
    return "target.kubernetes", None
