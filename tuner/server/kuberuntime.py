"""Each server as a Kubernetes pod (a LeaderWorkerSet across nodes): the Runtime
`server.lifecycle.Server` calls for `target.kubernetes` (`server.kubeforward` reaches the pod).

`KubeRuntime.wrap` creates the pod (and its Secret: manifests built in `server.kube`) and waits
until it is scheduled; the launch script then execs the follower (`server.kubefollow`), the
pod's attached client: its output is the server log, its exit code the container's. So the
launch group, its log and exit status work as a direct server's do, while the server runs in
the cluster. A pod outlives its killed follower, so once the follower's group is gone the pod
is deleted by its name and waited for (`remove`); a killed run's pods and Secrets are found by
the worker's label and deleted (`stop_strays`).

Whose failure: a pod not scheduled within `schedule_timeout_s` (no node has the GPUs), one the
cluster ended (evicted, its node lost, preempted, deleted by someone else) raise InfraError
with Kubernetes' own reason: the world's, never the configuration's. A pod that cannot start
for the user's setup (the image cannot be pulled, kubectl refusing the manifest) raises
SetupError. SGLang's own failures (an OOM, a refused flag) are in the container's log and
exit code, judged by `sglang.failures` as for any server.

kubectl runs on the tuner's machine (`host: local`, config/kubernetes.py) with target.env
(its PATH, KUBECONFIG): the values reach the shell through stdin, never a command line.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from tuner.config.kubernetes import KubernetesSection
from tuner.config.target import Timeouts
from tuner.errors import InfraError, SetupError
from tuner.hosts.base import CommandResult, Host
from tuner.server import kubefollow
from tuner.server.kube import (
    CONFIG_KEY,
    LWS_NAME_LABEL,
    create_argv,
    delete_argv,
    env_split,
    get_pod_argv,
    items,
    kubectl,
    list_argv,
    logs_argv,
    lws_manifest,
    lws_pods,
    manifest_list,
    marker_tag,
    pod_manifest,
    pod_name,
    secret_manifest,
    secret_name,
    shell,
)
from tuner.server.kubefollow import SETUP, WORLD, PodView, pod_view
from tuner.server.launch import LaunchSpec
from tuner.server.runtime import DirectRuntime, Gpus

log = logging.getLogger(__name__)

#: the follower, run as a file by the tuner's Python in isolated mode (standard library only)
FOLLOWER = str(Path(kubefollow.__file__).resolve())
#: kubectl's refusals that are the world's (the API server away, a quota others use up)
_WORLD = re.compile(
    r"unable to connect to the server|connection refused|i/o timeout|tls handshake timeout|"
    r"exceeded quota|the server is currently unable|etcdserver|context deadline exceeded|"
    r"too many requests",
    re.I,
)
MARKER_VAR = "TUNER_SERVER_MARKER"  # lifecycle.MARKER_VAR (lifecycle imports this package)


class KubeRuntime:
    """The server as the pod `<prefix>-<tag>-<random>` (tag per marker), one per start."""

    host_pids = False  # the pod's pids are its node's
    remote = True  # so are its port and GPUs: the lifecycle does not look for them here

    def __init__(
        self,
        host: Host,
        section: KubernetesSection,
        env: Mapping[str, str] | None = None,
        marker: str | None = None,
        timeouts: Timeouts | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.host = host
        self.section = section
        self.env = dict(env or {})
        self.marker = marker
        self.tag = marker_tag(marker)
        self.timeouts = timeouts or Timeouts()
        #: the current pod (created, not yet deleted): the endpoint forwards to it (with
        #: `nodes` > 1: the leader of the LeaderWorkerSet `lws`)
        self.pod: str | None = None
        self.lws: str | None = None
        self._clock, self._sleep = clock, sleep
        self._reported: set[str] = set()  # logs whose pod the cluster ended: said once

    # -- the Runtime seam -------------------------------------------------------------------

    def check_setup(self, spec: LaunchSpec) -> None:
        """SetupError unless kubectl is on the PATH (with target.env)."""
        prog = self.section.kubectl
        res = self.run(f"command -v -- {shlex.quote(prog)} >/dev/null || exit 3")
        if res.exit_code == 3:
            raise SetupError(
                f"target.kubernetes.kubectl: {prog} is not on the PATH on {self.host.name} "
                "(with target.env); install it or set target.env.PATH"
            )
        if not res.ok:
            raise InfraError(f"{self.host.name}: setup check failed (exit {res.exit_code})")

    def wrap(self, spec: LaunchSpec, config_path: str | None) -> LaunchSpec:
        """Create the pod of `spec` (and its Secret), wait until it is scheduled, and return the
        follower's launch. On any failure the pod is deleted and the secret flags' file on this
        machine removed before the error."""
        sec = self.section
        name = pod_name(sec.name_prefix, self.tag)
        plain, hidden = env_split(spec.env)
        data = dict(hidden)
        if spec.secret_flags:
            data[CONFIG_KEY] = spec.secrets_yaml()
        objs = [secret_manifest(sec, name, self.tag, data)] if data else []
        pod = pod_manifest(
            sec,
            name,
            self.tag,
            spec.argv,
            plain,
            secret_keys=sorted(hidden),
            config=bool(spec.secret_flags),
        )
        pods = [name]
        if sec.nodes > 1:  # one server over N pods: the set's leader is the one reached
            pod = lws_manifest(pod, sec.nodes, sec.dist_init_port)
            pods = lws_pods(name, sec.nodes)
        objs.append(pod)
        try:
            self.pod, self.lws = pods[0], (name if sec.nodes > 1 else None)
            self._create(manifest_list(objs))
            for each in pods:
                self._wait_scheduled(each, made_by_controller=self.lws is not None)
        except BaseException:
            if config_path:
                with contextlib.suppress(InfraError):
                    self.host.run_shell(f"rm -f -- {shlex.quote(config_path)}")
            with contextlib.suppress(InfraError):
                self._delete(name)
            raise
        argv = [sys.executable, "-I", FOLLOWER, "--kubectl", json.dumps(kubectl(sec))]
        argv += ["--pod", pods[0], "--poll", f"{sec.poll_s:g}"]
        return replace(spec, argv=tuple(argv), cwd=None)

    def remove(self, gpus: Gpus) -> list[int]:
        """The follower's group is gone: delete our pod and its Secret, wait until gone."""
        if self.lws is not None or self.pod is not None:
            self._delete(self.lws or self.pod or "")
        return []

    def stop_strays(self, gpus: Gpus) -> list[int]:
        """Delete every pod and Secret carrying our label (a killed run's)."""
        if not self.marker:
            return []
        kinds = "leaderworkersets,pods,secrets" if self.section.nodes > 1 else "pods,secrets"
        res = self.run(shell(list_argv(self.section, self.tag, kinds)))
        if not res.ok:
            raise InfraError(f"{self.host.name}: cannot list pods: {_said(res)}")
        # a set's pods go with it (deleted alone, its controller would make them again)
        found = [
            o
            for o in items(res.stdout)
            if not ((o.get("metadata") or {}).get("labels") or {}).get(LWS_NAME_LABEL)
        ]
        for obj in found:
            meta = obj.get("metadata") or {}
            log.warning(
                "%s: deleting %s %s of this worker (an earlier run's, or one not deleted)",
                self.host.name,
                str(obj.get("kind", "object")).lower(),
                meta.get("name"),
            )
        names = [
            f"{str(o.get('kind', '')).lower()}/{(o.get('metadata') or {}).get('name')}"
            for o in found
        ]
        if names:
            self._delete_names(names)
        return []

    def exit_and_tail(self, log_path: str, lines: int) -> tuple[int | None, list[str]]:
        """The follower's exit code and log tail; the container's (`kubectl logs`, its status)
        when the follower's are missing; InfraError, once per log, when the cluster ended the
        pod (the follower's WORLD line)."""
        code, tail = DirectRuntime(self.host).exit_and_tail(log_path, lines)
        if self.lws is not None and log_path not in self._reported:
            self._worker_lost(log_path)
        if (code is None or not tail) and self.pod is not None:
            view = self.view(self.pod)
            res = self.run(shell(logs_argv(self.section, self.pod, lines)) + " 2>&1")
            if view is not None and code is None:
                code = view.exit_code
            tail = tail or (res.stdout.splitlines() if res.ok else [])
        why = next((ln[len(WORLD) :] for ln in reversed(tail[-5:]) if ln.startswith(WORLD)), None)
        if why is None or log_path in self._reported:
            return code, tail
        self._reported.add(log_path)
        raise InfraError(
            f"kubernetes: the cluster ended the server's pod: {why[:300]} (the world's failure, "
            "not the configuration's)"
        )

    def _worker_lost(self, log_path: str) -> None:
        """InfraError (once per log) when the cluster ended a worker pod of the set (evicted,
        its node lost, deleted): the leader's end is then the world's, whatever it logged."""
        assert self.lws is not None
        for worker in lws_pods(self.lws, self.section.nodes)[1:]:
            view = self.view(worker)
            why = "deleted" if view is None else view.world
            if why:
                self._reported.add(log_path)
                raise InfraError(
                    f"kubernetes: the cluster ended worker pod {worker} of the server's "
                    f"LeaderWorkerSet: {why[:300]} (the world's failure, not the configuration's)"
                )

    def setup_error(
        self, code: int | None, tail: Sequence[str], mask: Callable[[str], str]
    ) -> SetupError | None:
        """SetupError when the pod cannot start for the user's setup (image, container config)."""
        why = next((ln[len(SETUP) :] for ln in reversed(tail[-5:]) if ln.startswith(SETUP)), None)
        if why is None:
            return None
        return SetupError(
            f"target.kubernetes: the pod cannot start: {mask(why)[:300]}; check "
            "target.kubernetes.image and pod_patch"
        )

    def release(self) -> None:
        """The study ended (its last server stopped): delete any pod or Secret of ours still
        there (one whose deletion failed), so none outlives the study."""
        self.stop_strays(lambda: ())
        self.pod = self.lws = None

    # -- kubectl ------------------------------------------------------------------------------

    def run(self, script: str, stdin: str = "", timeout: float | None = None) -> CommandResult:
        """`script` with target.env exported (from stdin's first line, base64: values never
        on a command line); the rest of stdin is the script's."""
        exports = "".join(
            f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(self.env.items())
        )
        head = base64.b64encode(exports.encode()).decode()
        return self.host.run_shell(
            f'IFS= read -r E && eval "$(printf %s "$E" | base64 -d)" && {script}',
            timeout=timeout or self.section.command_timeout_s,
            stdin=(head + "\n" + stdin).encode(),
        )

    def view(self, pod: str) -> PodView | None:
        """The pod judged (`kubefollow.pod_view`); None when it does not exist."""
        res = self.run(shell(get_pod_argv(self.section, pod)))
        if not res.ok:
            if "NotFound" in res.stderr or "not found" in res.stderr:
                return None
            raise InfraError(f"kubernetes: kubectl get pod {pod} failed: {_said(res)}")
        found = items(res.stdout)
        if not found:
            raise InfraError(f"kubernetes: kubectl get pod {pod}: unreadable output")
        return pod_view(found[0])

    def _create(self, manifests: str) -> None:
        res = self.run(shell(create_argv(self.section)), stdin=manifests)
        if res.ok:
            return
        why = _said(res)
        if _WORLD.search(why):
            raise InfraError(f"kubernetes: kubectl create failed: {why}")
        raise SetupError(
            f"target.kubernetes: kubectl create refused the pod in namespace "
            f"{self.section.namespace}: {why}; check the namespace, your rights "
            "(`tuner check`) and pod_patch"
        )

    def _wait_scheduled(self, pod: str, *, made_by_controller: bool = False) -> None:
        """Return once the pod is scheduled (or already started, or waiting for the user's
        image: the follower says so); InfraError with the scheduler's reason past
        schedule_timeout_s, or when the cluster ended it first. A pod the LWS controller
        makes may not exist yet: it is waited for, within the same deadline."""
        limit = self.section.schedule_timeout_s
        deadline = self._clock() + limit
        wait = 0.05
        while True:
            view = self.view(pod)
            if view is None and made_by_controller and self._clock() <= deadline:
                self._sleep(wait)
                wait = min(wait * 2, self.section.poll_s)
                continue
            if view is None and made_by_controller:
                raise InfraError(
                    f"kubernetes: pod {pod} of LeaderWorkerSet {self.lws} not created within "
                    f"{limit:g} s (target.kubernetes.schedule_timeout_s; is the LWS controller "
                    "installed?) (the world's failure, not the configuration's)"
                )
            if view is None:
                raise InfraError(f"kubernetes: pod {pod} was deleted before it was scheduled")
            if view.world:
                raise InfraError(
                    f"kubernetes: the cluster ended pod {pod} before it started: {view.world} "
                    "(the world's failure, not the configuration's)"
                )
            if view.scheduled or view.started or view.setup:
                return
            if self._clock() > deadline:
                why = view.pending_why or f"phase {view.phase}"
                raise InfraError(
                    f"kubernetes: pod {pod} not scheduled within {limit:g} s "
                    f"(target.kubernetes.schedule_timeout_s): {why[:300]} (the world's failure, "
                    "not the configuration's; pod deleted)"
                )
            self._sleep(wait)
            wait = min(wait * 2, self.section.poll_s)

    def _delete(self, name: str) -> None:
        """Delete the pod `name` (or the set `name` and its pods) and its Secret."""
        if name == self.lws:
            pods = lws_pods(name, self.section.nodes)
            self._delete_names([f"leaderworkerset/{name}", f"secret/{secret_name(name)}"], pods)
            self.lws = self.pod = None
            return
        self._delete_names([f"pod/{name}", f"secret/{secret_name(name)}"])
        if self.pod == name:
            self.pod = None

    def _delete_names(self, names: Sequence[str], pods: Sequence[str] = ()) -> None:
        """Delete the objects and wait until they are gone (kubectl's wait, then a look)."""
        wait_s = self.section.grace_period_s + self.timeouts.stop_s
        res = self.run(
            shell(delete_argv(self.section, names, wait_s)),
            timeout=wait_s + self.section.command_timeout_s,
        )
        if not res.ok:
            raise InfraError(f"kubernetes: kubectl delete {' '.join(names)} failed: {_said(res)}")
        pods = [*pods, *(n[4:] for n in names if n.startswith("pod/"))]
        for pod in pods:
            if self.view(pod) is not None:
                raise InfraError(f"kubernetes: pod/{pod} still there {wait_s:g} s after delete")


def _said(res: CommandResult) -> str:
    lines = [ln.strip() for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
    return (lines[-1] if lines else f"exit {res.exit_code}")[:300]
