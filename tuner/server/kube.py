"""The server as a Kubernetes pod: the manifests and every kubectl command line the tuner runs for
the study file's `target.kubernetes` (its schema: `config/kubernetes.py`). Pure (no I/O);
`server.kuberuntime` runs them.

Each server is one pod, `PREFIX-TAG-RANDOM` (TAG: 10 hex of the worker's marker), labelled
`tuner/marker=TAG`, so a resumed run finds a killed run's pods (and their Secrets) by that label
selector and deletes them. The pod's one container, `sglang`, runs `target.launch` + the trial's
flags in `target.kubernetes.image`, asks for `gpus` x `gpu_resource` (requests = limits), on
nodes matching `node_selector`; `restartPolicy: Never`, so a server that exits is judged, not
restarted. `pod_patch` is merged into this pod last (`merge_patch`).

Secrets never enter the pod's spec: the secret flags (the API key) reach SGLang as its
`--config` file, a key of a Secret `POD-secrets` mounted read-only at SECRET_DIR; variables of
target.env whose names look secret (HF_TOKEN) come from the same Secret by `secretKeyRef`. The
Secret carries the pod's labels and is deleted with it. Every manifest goes to `kubectl create
-f -` on stdin, never on a command line.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.config.kubernetes import CONTAINER, KubernetesSection
from tuner.server.launch import is_secret_variable

#: the labels every object of a worker carries (the marker's, to find them again)
MARKER_LABEL = "tuner/marker"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
#: where the secret flags' --config file is mounted in the pod, and its key in the Secret
SECRET_DIR = "/etc/tuner"
CONFIG_KEY = "sglang-config.yaml"
#: variables of target.env that stay on the tuner's side (kubectl's PATH and cluster), never
#: in the pod: the image has its own PATH
LOCAL_ONLY_ENV = frozenset({"PATH", "KUBECONFIG", "HOME"})
#: the command in the pod when target.launch is not given (the sglang images' python)
DEFAULT_LAUNCH = ("python3", "-m", "sglang.launch_server")


def marker_tag(marker: str | None) -> str:
    """10 hex of the worker's marker (a label value; random without a marker)."""
    return hashlib.sha256(marker.encode()).hexdigest()[:10] if marker else secrets.token_hex(5)


def pod_name(prefix: str, tag: str) -> str:
    """A new pod's name: unique per start, so a pod still terminating never blocks the next."""
    return f"{prefix}-{tag}-{secrets.token_hex(3)}"


def secret_name(pod: str) -> str:
    return f"{pod}-secrets"


def labels(tag: str) -> dict[str, str]:
    return {MANAGED_LABEL: "tuner", MARKER_LABEL: tag}


def selector(tag: str) -> str:
    """The label selector of every pod and Secret of the worker."""
    return f"{MARKER_LABEL}={tag}"


def env_split(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) variables the pod gets from target.env (the tuner's own side dropped):
    secret-looking names go into the Secret, never into the pod's spec."""
    plain, hidden = {}, {}
    for k, v in sorted(env.items()):
        if k in LOCAL_ONLY_ENV:
            continue
        (hidden if is_secret_variable(k) else plain)[k] = str(v)
    return plain, hidden


def pod_manifest(
    section: KubernetesSection,
    name: str,
    tag: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    secret_keys: Sequence[str] = (),
    config: bool = False,
) -> dict[str, Any]:
    """The pod of one server: `argv` (target.launch + flags; `--config FILE` added when
    `config`), the image, the GPU request, the node selector, the marker's labels; secret
    variables `secret_keys` from the Secret; `pod_patch` merged last."""
    args = [*argv[1:], *(["--config", f"{SECRET_DIR}/{CONFIG_KEY}"] if config else [])]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": section.image,
        "command": [argv[0]],
        "args": args,
        "env": [{"name": k, "value": v} for k, v in env.items()]
        + [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name(name), "key": k}}}
            for k in secret_keys
        ],
    }
    if section.gpus:
        amount = {section.gpu_resource: str(section.gpus)}
        container["resources"] = {"limits": dict(amount), "requests": dict(amount)}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": section.grace_period_s,
        "containers": [container],
    }
    if config:
        container["volumeMounts"] = [
            {"name": "tuner-secrets", "mountPath": SECRET_DIR, "readOnly": True}
        ]
        spec["volumes"] = [
            {
                "name": "tuner-secrets",
                "secret": {
                    "secretName": secret_name(name),
                    "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
                },
            }
        ]
    if section.node_selector:
        spec["nodeSelector"] = dict(section.node_selector)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": section.namespace, "labels": labels(tag)},
        "spec": spec,
    }
    return merge_patch(pod, section.pod_patch)


#: LeaderWorkerSet (kubernetes-sigs/lws): the API, the label naming each pod's index in its
#: group (0: the leader), and the variables the controller sets in every container (native
#: since LWS v0.6.0): the leader's address, the group's size, the pod's index
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_ENV = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")


def lws_pods(name: str, size: int) -> list[str]:
    """The pods of the set `name` with one group, as LWS names them: the leader `NAME-0` (the
    leader StatefulSet's ordinal 0), then the workers `NAME-0-1` .. `NAME-0-(size-1)` (the
    group's worker StatefulSet `NAME-0`, ordinals from 1)."""
    return [f"{name}-0", *(f"{name}-0-{i}" for i in range(1, size))]


def lws_manifest(pod: Mapping[str, Any], nodes: int, dist_init_port: int) -> dict[str, Any]:
    """The LeaderWorkerSet of one server spanning `nodes` pods, from its one-pod manifest
    (`pod_manifest`, the patch merged): the leader and worker templates are that pod, the
    server's args plus `--nnodes N --node-rank $(LWS_WORKER_INDEX) --dist-init-addr
    $(LWS_LEADER_ADDRESS):PORT` (the kubelet expands `$(VAR)` from the container's env, where
    the controller put them). `replicas: 1` (one server), restartPolicy `None`: a pod that
    fails is judged by the tuner, the group is not recreated behind its back."""
    meta = pod["metadata"]
    spec = copy.deepcopy(pod["spec"])
    for c in spec["containers"]:
        if c["name"] == CONTAINER:
            c["args"] = [
                *c.get("args", []),
                "--nnodes",
                str(nodes),
                "--node-rank",
                "$(LWS_WORKER_INDEX)",
                "--dist-init-addr",
                f"$(LWS_LEADER_ADDRESS):{dist_init_port}",
            ]
    template = {
        "metadata": {
            k: copy.deepcopy(v) for k, v in meta.items() if k in ("labels", "annotations")
        },
        "spec": spec,
    }
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": copy.deepcopy(meta["labels"]),
        },
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "None",
                "leaderTemplate": copy.deepcopy(template),
                "workerTemplate": template,
            },
        },
    }


def secret_manifest(
    section: KubernetesSection, pod: str, tag: str, data: Mapping[str, str]
) -> dict[str, Any]:
    """The Secret of one pod: its --config file and secret variables (stringData)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(pod),
            "namespace": section.namespace,
            "labels": labels(tag),
        },
        "stringData": dict(data),
    }


def manifest_list(items: Sequence[Mapping[str, Any]]) -> str:
    """The objects as one JSON `List` for `kubectl create -f -` (created in this order)."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)})


def merge_patch(base: Any, patch: Any) -> Any:
    """`patch` merged into `base`, as the docs promise a pod_patch is: mappings merge key by
    key (a null value removes the key), a list whose items all carry a `name` (containers,
    volumes, volumeMounts, env) merges item by item by name (new names appended), any other
    list and any other value replaces. Neither argument is changed."""
    if isinstance(base, Mapping) and isinstance(patch, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge_patch(out[key], value) if key in out else _plain(value)
        return out
    if _named(base) and _named(patch):
        out_list = [copy.deepcopy(item) for item in base]
        where = {item["name"]: i for i, item in enumerate(out_list)}
        for item in patch:
            if item["name"] in where:
                out_list[where[item["name"]]] = merge_patch(out_list[where[item["name"]]], item)
            else:
                out_list.append(_plain(item))
        return out_list
    return _plain(patch)


def _named(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, Mapping) and "name" in i for i in value)
    )


def _plain(value: Any) -> Any:
    """A patch value with its nulls dropped (a null means "remove", never "set to null")."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


# -- kubectl command lines -------------------------------------------------------------------


def kubectl(section: KubernetesSection, *args: str, namespaced: bool = True) -> list[str]:
    """`kubectl [--context C] [--namespace NS] ARGS`."""
    argv = [section.kubectl]
    if section.context:
        argv += ["--context", section.context]
    if namespaced:
        argv += ["--namespace", section.namespace]
    return [*argv, *args]


def create_argv(section: KubernetesSection) -> list[str]:
    """Create the objects of the JSON list on stdin; prints `pod/NAME` lines."""
    return kubectl(section, "create", "-f", "-", "-o", "name")


def get_pod_argv(section: KubernetesSection, pod: str) -> list[str]:
    return kubectl(section, "get", "pod", pod, "-o", "json")


def list_argv(section: KubernetesSection, tag: str, kinds: str = "pods") -> list[str]:
    """Every object of `kinds` carrying the worker's label, as a JSON List."""
    return kubectl(section, "get", kinds, "-l", selector(tag), "-o", "json")


def delete_argv(section: KubernetesSection, names: Sequence[str], wait_s: float) -> list[str]:
    """Delete `names` (`pod/NAME`, `secret/NAME`, `leaderworkerset/NAME`), waiting until they
    are gone (kubectl's own wait, bounded; foreground: a set is gone once its pods are); a
    name already gone is fine."""
    return kubectl(
        section,
        "delete",
        *names,
        "--ignore-not-found",
        "--wait=true",
        *(["--cascade=foreground"] if any(n.startswith("leaderworkerset") for n in names) else []),
        f"--timeout={int(wait_s)}s",
    )


def logs_argv(section: KubernetesSection, pod: str, lines: int) -> list[str]:
    return kubectl(section, "logs", f"pod/{pod}", "-c", CONTAINER, f"--tail={int(lines)}")


def port_forward_argv(section: KubernetesSection, pod: str, local: int, remote: int) -> list[str]:
    """A local port on 127.0.0.1 forwarded to the pod's `remote` port (the pod's loopback: the
    server keeps SGLang's default --host 127.0.0.1)."""
    return kubectl(
        section, "port-forward", "--address", "127.0.0.1", f"pod/{pod}", f"{local}:{remote}"
    )


def can_i_argv(section: KubernetesSection, verb: str, resource: str) -> list[str]:
    return kubectl(section, "auth", "can-i", verb, resource)


def namespace_argv(section: KubernetesSection) -> list[str]:
    return kubectl(section, "get", "namespace", section.namespace, "-o", "name", namespaced=False)


def nodes_argv(section: KubernetesSection) -> list[str]:
    """The nodes the node selector matches, as a JSON List."""
    sel = ",".join(f"{k}={v}" for k, v in section.node_selector.items())
    return kubectl(
        section, "get", "nodes", *(["-l", sel] if sel else []), "-o", "json", namespaced=False
    )


def items(text: str) -> list[dict[str, Any]]:
    """The objects of `get -o json` output (a List's items, or the one object); [] if unreadable."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    found = data.get("items") if data.get("kind", "").endswith("List") else [data]
    return [i for i in found or [] if isinstance(i, dict)]


def gpu_nodes(nodes: Sequence[Mapping[str, Any]], resource: str) -> list[tuple[str, int]]:
    """(name, allocatable `resource`) of each schedulable node, most GPUs first."""
    out = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
        count = int(value) if str(value).isdigit() else 0
        out.append((str((node.get("metadata") or {}).get("name", "?")), count))
    return sorted(out, key=lambda x: -x[1])


def shell(argv: Sequence[str]) -> str:
    """One command line, every value quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)
