"""A `target.kubernetes` study's checks, with kubectl on this machine (target.env: its PATH,
KUBECONFIG): kubectl itself, the namespace, the user's rights on pods (`kubectl auth can-i`),
and whether some node matching the selector has the GPUs asked (allocatable). Nothing is
created: what the pod's node holds (its GPUs, RAM, the port, the image's SGLang and model
paths) is not probed from here, and those lines say so (`on_pod`)."""

from __future__ import annotations

from tuner.check.lines import CheckLine, fail, ok, skip, warn
from tuner.check.probe import Probe, said
from tuner.config.kubernetes import KubernetesSection
from tuner.errors import ConfigError, InfraError, SetupError
from tuner.server.kube import (
    can_i_argv,
    gpu_nodes,
    items,
    kubectl,
    namespace_argv,
    nodes_argv,
    shell,
)

#: the checks about the machine and image the server runs in: the pod's, not this machine's
ON_POD = frozenset(
    {
        "sglang",
        "flags",
        "gpus",
        "gpu processes",
        "host ram",
        "model path",
        "draft model",
        "port",
        "http path",
    }
)
#: what the tuner does with pods, as `kubectl auth can-i VERB RESOURCE` asks it
RIGHTS = (
    ("create", "pods"),
    ("delete", "pods"),
    ("get", "pods"),
    ("list", "pods"),
    ("get", "pods/log"),
    ("create", "pods/portforward"),
    ("create", "secrets"),
    ("delete", "secrets"),
    ("list", "secrets"),
)


def section(p: Probe) -> KubernetesSection:
    assert p.cfg.target.kubernetes is not None, "only planned for a target.kubernetes study"
    return p.cfg.target.kubernetes


def on_pod(name: str) -> CheckLine:
    """The skip line of a check about the server's machine or image (the pod's)."""
    return skip(name, "in the pod (target.kubernetes): its node and image are not probed from here")


def client(p: Probe) -> CheckLine:
    """kubectl on the PATH (with target.env), and its version."""
    sec = section(p)
    res = p.run_env(shell(kubectl(sec, "version", "--client", "-o", "json", namespaced=False)))
    if res.exit_code == 127:
        return fail(
            "kubectl",
            f"{sec.kubectl} is not on the PATH on {p.where} (with target.env); install it or "
            "set target.kubernetes.kubectl / target.env.PATH",
            SetupError,
        )
    found = items(res.stdout)
    version = ((found[0].get("clientVersion") or {}) if found else {}).get("gitVersion", "")
    if not res.ok:
        return fail("kubectl", f"`{sec.kubectl} version --client` failed ({said(res)})", SetupError)
    return ok("kubectl", f"{sec.kubectl} {version or '(version unknown)'}")


def namespace(p: Probe) -> CheckLine:
    """The namespace exists and the cluster answers (the kubeconfig's credentials work)."""
    sec = section(p)
    res = p.run_env(shell(namespace_argv(sec)), p.deadlines.http_s + sec.command_timeout_s)
    where = f" (context {sec.context})" if sec.context else ""
    if res.ok:
        return ok("namespace", f"{sec.namespace} exists{where}")
    why = said(res)
    if "NotFound" in why or "not found" in why:
        return fail(
            "namespace",
            f"target.kubernetes.namespace: no namespace {sec.namespace}{where} ({why})",
            ConfigError,
        )
    if "Forbidden" in why or "forbidden" in why:  # may not read namespaces: the pods will tell
        return warn("namespace", f"cannot read namespace {sec.namespace}{where}: {why}")
    return fail("namespace", f"the cluster{where} does not answer: {why}", InfraError)


def rights(p: Probe) -> CheckLine:
    """`kubectl auth can-i` for every verb the tuner uses on pods, their logs, port-forward
    and Secrets in the namespace."""
    sec = section(p)
    # asked side by side: each kubectl call is a round trip to the API server
    script = (
        " ".join(
            f"{{ {shell(can_i_argv(sec, verb, res))} >/dev/null 2>&1 || echo {verb}:{res}; }} &"
            for verb, res in RIGHTS
        )
        + " wait"
    )
    res = p.run_env(script, sec.command_timeout_s)
    said_no = {w.replace(":", " ") for w in res.stdout.split()}
    missing = [f"{verb} {res_}" for verb, res_ in RIGHTS if f"{verb} {res_}" in said_no]
    if missing:
        return fail(
            "pod rights",
            f"in namespace {sec.namespace} you may not {', '.join(missing)} "
            "(kubectl auth can-i); ask for a Role with them",
            SetupError,
        )
    return ok(
        "pod rights",
        f"create, delete, get, logs, port-forward of pods and Secrets in {sec.namespace}",
    )


def nodes(p: Probe) -> CheckLine:
    """Some schedulable node matching node_selector has `gpus` x `gpu_resource` allocatable."""
    sec = section(p)
    res = p.run_env(shell(nodes_argv(sec)), sec.command_timeout_s)
    if not res.ok:
        return warn("gpu nodes", f"cannot list nodes ({said(res)}): the GPU request is not checked")
    found = gpu_nodes(items(res.stdout), sec.gpu_resource)
    sel = ", ".join(f"{k}={v}" for k, v in sec.node_selector.items())
    which = f"nodes matching {sel}" if sel else "nodes"
    if not found:
        return fail(
            "gpu nodes",
            f"no schedulable {which}: fix target.kubernetes.node_selector",
            ConfigError,
        )
    shown = ", ".join(f"{n} ({g} {sec.gpu_resource})" for n, g in found[:3])
    fit = [n for n, g in found if g >= sec.gpus]
    if not fit:
        return fail(
            "gpu nodes",
            f"{which} have at most {found[0][1]} {sec.gpu_resource}, the pod asks "
            f"target.kubernetes.gpus {sec.gpus}: {shown}",
            ConfigError,
        )
    return ok(
        "gpu nodes",
        f"{len(fit)} of {len(found)} {which} can hold {sec.gpus} {sec.gpu_resource}: {shown} "
        "(allocatable, not what is free now)",
    )
