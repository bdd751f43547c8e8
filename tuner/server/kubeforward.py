"""The way to a Kubernetes study's server: `kubectl port-forward` to the current pod, run on the
tuner's machine in its own process group (the marker in its environment, so a killed run's is
found), restarted when it ends while the pod runs; and `kube_parts`, the runtime and this
endpoint for `api.build_seams`."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tuner.config.target import TargetSection
from tuner.errors import InfraError
from tuner.hosts.base import Host
from tuner.server.endpoint import url_for
from tuner.server.kube import port_forward_argv
from tuner.server.kuberuntime import MARKER_VAR, KubeRuntime

log = logging.getLogger(__name__)

#: how long a port-forward may take to say it listens
FORWARD_START_S = 10.0


class KubeEndpoint:
    """The way to the current pod's port: a `kubectl port-forward` on this machine (its own
    process group, the marker in its environment so a killed run's is found), started when the
    pod is there, restarted when it ends while the pod runs (a break) or the pod changes."""

    def __init__(self, runtime: KubeRuntime, *, retry_s: float = 0.5):
        self.runtime = runtime
        self.retry_s = retry_s
        self.local = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None
        self._pod: str | None = None
        self._remote: int | None = None
        self._up = False  # the current forward said it listens
        self._breaks = 0
        self._next = 0.0
        self._fatal: str | None = None  # kubectl cannot forward at all (missing, forbidden)

    def url(self, port: int) -> str:
        self._ensure(port)
        return url_for("127.0.0.1", self.local)

    def describe(self, port: int) -> str:
        pod = self.runtime.pod or "(none yet)"
        return f"kubectl port-forward 127.0.0.1:{self.local} -> pod {pod} port {port}"

    def unreachable(self) -> str | None:
        return self._fatal

    def connects(self, port: int, timeout_s: float) -> bool | None:
        self._ensure(port)
        if self._fatal:
            return None
        if not self._up:
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.local), timeout=timeout_s):
                return True
        except OSError:
            return False

    def breaks(self) -> int:
        self._ensure(self._remote or 0)
        return self._breaks

    def close(self) -> None:
        self._stop()
        self._pod = None

    # -- the forward process ------------------------------------------------------------------

    def _ensure(self, port: int) -> None:
        pod = self.runtime.pod
        if pod != self._pod or (port and port != self._remote):
            self._stop()
            self._pod, self._remote = pod, port or self._remote
        if pod is None or self._remote is None:
            return
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:  # it ended by itself
            was_up, why = self._up, self._last_line()
            self._stop()
            if was_up and self._pod_runs(pod):
                self._breaks += 1
                log.warning(
                    "kubectl port-forward to pod %s ended (%s); starting it again", pod, why
                )
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.retry_s
            self._start(pod, self._remote)

    def _pod_runs(self, pod: str) -> bool:
        try:
            view = self.runtime.view(pod)
        except InfraError:
            return True  # the API server away: the way broke all the same
        return view is not None and view.started and view.exit_code is None and not view.world

    def _start(self, pod: str, remote: int) -> None:
        fd, out = tempfile.mkstemp(prefix="tuner-port-forward-", suffix=".log")
        self._out = Path(out)
        env = {**os.environ, **self.runtime.env}
        if self.runtime.marker:
            env[MARKER_VAR] = self.runtime.marker
        argv = port_forward_argv(self.runtime.section, pod, self.local, remote)
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._fatal = f"cannot run {argv[0]}: {exc}"
            self._stop()
            return
        finally:
            os.close(fd)
        deadline = time.monotonic() + FORWARD_START_S
        while time.monotonic() < deadline:
            text = self._out.read_text(errors="replace")
            if "Forwarding from" in text:
                self._up, self._fatal = True, None
                return
            if self._proc.poll() is not None:
                break
            time.sleep(0.02)
        why = self._last_line()
        if re.search(r"forbidden|unauthorized", why, re.I):
            self._fatal = f"kubectl port-forward to pod {pod} refused: {why}"
        elif re.search(r"address already in use", why, re.I):
            self.local = _free_port()  # someone took our port: the URL follows (`following`)
        self._stop()

    def _last_line(self) -> str:
        if self._out is None or not self._out.exists():
            return ""
        lines = [
            ln.strip() for ln in self._out.read_text(errors="replace").splitlines() if ln.strip()
        ]
        return lines[-1][:300] if lines else ""

    def _stop(self) -> None:
        proc, self._proc, self._up = self._proc, None, False
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._out.unlink()
            self._out = None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kube_parts(
    target: TargetSection, host: Host, env: Mapping[str, str], marker: str | None
) -> tuple[KubeRuntime, KubeEndpoint]:
    """The runtime and the endpoint of a `target.kubernetes` study (api.build_seams)."""
    assert target.kubernetes is not None
    runtime = KubeRuntime(host, target.kubernetes, env, marker, target.timeouts)
    return runtime, KubeEndpoint(runtime)
