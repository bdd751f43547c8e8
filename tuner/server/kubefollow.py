"""What a pod's status says (`pod_view`, pure), and the follower: the attached client of a pod.

The follower is the launch group of a Kubernetes server (`server.kuberuntime`), as `docker run`
is a container's: it waits until the pod's container starts, copies its log (`kubectl logs -f`)
to its stdout (the server log), and exits with the container's exit code, so the lifecycle's
process group, log and exit status work as for any server. When the cluster, not the server,
ended the pod (evicted, its node lost, preempted, deleted by someone else) it writes one line
starting with WORLD and exits 1; when the pod cannot start for the user's setup (the image
cannot be pulled, a bad container config) one line starting with SETUP and exits 125. The
runtime reads those lines (the world's failure, or the user's), never the flags'.

It runs as a file with the standard library only (`python -I kubefollow.py ...`: no tuner
import, no PYTHONPATH needed); unknown trailing arguments (the `--config FILE` every launch
script appends) are ignored: the pod reads its secret flags from its Secret.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

#: the follower's own lines in the server log
WORLD = "tuner-kube: the cluster ended the pod: "
SETUP = "tuner-kube: the pod cannot start: "
#: a waiting container that will not start for the user's setup (the image name, its config)
SETUP_WAITING = frozenset(
    {"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError"}
)
#: a pull that failed: the user's when the registry refused the reference (a typo, no access);
#: a registry or network that did not answer is the world's (the kubelet retries, the start's
#: deadline ends it). ImagePullBackOff's own message has no detail: its ErrImagePull turns say
PULL_FAILED = frozenset({"ErrImagePull", "ImagePullBackOff"})
_PULL_REFUSED = re.compile(
    r"not found|denied|unauthorized|manifest unknown|does not exist|invalid reference", re.I
)
#: a terminated container's reason that says its node went away, not the server
WORLD_TERMINATED = frozenset({"ContainerStatusUnknown"})
#: the server's container in the pod (config.kubernetes.CONTAINER: not imported, stdlib only)
CONTAINER = "sglang"


@dataclass(frozen=True)
class PodView:
    """A pod as the tuner judges it."""

    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    scheduled: bool  # condition PodScheduled is True
    pending_why: str  # PodScheduled False: "Unschedulable: 0/3 nodes are available: ..."
    started: bool  # the server's container runs or ran
    exit_code: int | None  # the terminated container's
    world: str | None  # the cluster ended it (evicted, node lost, preempted): why
    setup: str | None  # it cannot start for the user's setup (image, config): why
    waiting: str = ""  # the container's waiting reason and message (ContainerCreating, ...)


def pod_view(pod: dict[str, Any]) -> PodView:
    """Judge `kubectl get pod -o json` output."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    sched = conds.get("PodScheduled") or {}
    scheduled = sched.get("status") == "True"
    pending_why = ""
    if sched.get("status") == "False":
        pending_why = ": ".join(str(x) for x in (sched.get("reason"), sched.get("message")) if x)
    cs = next((c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), {})
    state = cs.get("state") or {}
    waiting, running, ended = state.get("waiting"), state.get("running"), state.get("terminated")
    code = ended.get("exitCode") if isinstance(ended, dict) else None
    world = None
    disrupted = conds.get("DisruptionTarget") or {}
    if status.get("reason") and phase in ("Failed", "Unknown"):  # Evicted, NodeLost, Shutdown
        world = _said(status.get("reason"), status.get("message"))
    elif disrupted.get("status") == "True":  # preempted, evicted by the API, a tainted node
        world = _said(disrupted.get("reason"), disrupted.get("message"))
    elif isinstance(ended, dict) and ended.get("reason") in WORLD_TERMINATED:
        world = _said(ended.get("reason"), ended.get("message"))
    elif phase == "Unknown":
        world = "the pod's node stopped reporting (phase Unknown)"
    setup = None
    if isinstance(waiting, dict):
        why = _said(waiting.get("reason"), waiting.get("message"))
        reason = waiting.get("reason")
        if reason in SETUP_WAITING or (reason in PULL_FAILED and _PULL_REFUSED.search(why)):
            setup = why
    return PodView(
        phase,
        scheduled,
        pending_why,
        isinstance(running, dict) or isinstance(ended, dict),
        int(code) if isinstance(code, int) else None,
        world,
        setup,
        _said(waiting.get("reason"), waiting.get("message")) if isinstance(waiting, dict) else "",
    )


def _said(reason: Any, message: Any) -> str:
    return ": ".join(str(x).strip() for x in (reason, message) if x)


# -- the follower -----------------------------------------------------------------------------


def _get(kubectl: list[str], pod: str) -> PodView | None:
    """The pod's view; None when it is gone (NotFound). Raises OSError when kubectl fails."""
    res = subprocess.run(
        [*kubectl, "get", "pod", pod, "-o", "json"], capture_output=True, text=True, timeout=120
    )
    if res.returncode != 0:
        if "NotFound" in res.stderr or "not found" in res.stderr:
            return None
        raise OSError(res.stderr.strip()[-300:] or f"kubectl get exited {res.returncode}")
    return pod_view(json.loads(res.stdout))


def follow(kubectl: list[str], pod: str, poll_s: float) -> int:
    """Wait for the container, copy its log, return its exit code (see the module docstring)."""
    wait = 0.05
    said = ""
    while True:  # until the container starts (the pod was scheduled before we were started)
        try:
            view = _get(kubectl, pod)
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            if str(exc) != said:  # a blip of the API server: said once, asked again
                said = str(exc)
                print(f"tuner-kube: kubectl get pod {pod}: {said}", flush=True)
            time.sleep(poll_s)
            continue
        if view is None:
            print(f"{WORLD}pod {pod} was deleted before its server started", flush=True)
            return 1
        if view.setup:
            print(f"{SETUP}{view.setup}", flush=True)
            return 125
        if view.world:
            print(f"{WORLD}{view.world}", flush=True)
            return 1
        if view.started:
            break
        if view.waiting and view.waiting != said:  # the evidence of a start that times out
            said = view.waiting
            print(f"tuner-kube: pod {pod} waiting: {said}", flush=True)
        time.sleep(wait)
        wait = min(wait * 2, poll_s)
    tail: list[str] = []
    while True:  # follow the log; a stream cut while the container runs is followed again
        subprocess.run(
            [*kubectl, "logs", "-f", f"pod/{pod}", "-c", CONTAINER, *tail], stdin=subprocess.DEVNULL
        )
        tail = ["--tail=0"]
        for _ in range(40):  # the status catches up with the log's end
            try:
                view = _get(kubectl, pod)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                time.sleep(poll_s)
                continue
            if view is None or view.world or view.exit_code is not None:
                break
            time.sleep(min(0.25, poll_s))
        if view is None:
            print(f"{WORLD}pod {pod} was deleted while its server ran", flush=True)
            return 1
        if view.world:
            print(f"{WORLD}{view.world}", flush=True)
            return 1
        if view.exit_code is not None:
            return view.exit_code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubefollow")
    parser.add_argument("--kubectl", required=True, help="kubectl's argv prefix, as JSON")
    parser.add_argument("--pod", required=True)
    parser.add_argument("--poll", type=float, default=2.0)
    args, _ = parser.parse_known_args(argv)  # the launch script's `--config FILE`: ignored
    return follow(list(json.loads(args.kubectl)), args.pod, args.poll)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
