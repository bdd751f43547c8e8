"""Secrets never shown: not in `ps` on the host, not in any file the run leaves, host files private.

Unique random values are planted in every secret-bearing place (the API key through
target.api_key_env, a secret-named target.env value like HF_TOKEN); `ps -eo args` is sampled
all through the run; afterwards every file under runs/ and every host-side file next to the
server logs (.log, .pid, .exit, .sh, .secrets.yaml) is searched. The simulator logs its
server_args, API key included, as SGLang does, so the host log is a real test of the masking.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.helpers.net import free_port
from tests.helpers.procs import kill_marked
from tests.helpers.sshd import Sshd, assert_group_gone
from tests.helpers.studies import study_file, tuner
from tuner.config.target import Timeouts
from tuner.hosts import Host
from tuner.server.launch import build_launch
from tuner.server.lifecycle import Server

pytestmark = pytest.mark.slow

T = Timeouts(ready_s=30, stop_s=20, port_free_s=2, gpu_free_s=5, poll_s=0.05, http_s=2)
SIM = [sys.executable, "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"]


class PsWatch:
    """Samples `ps -eo args` (every process of the machine) until stopped; keeps the hits."""

    def __init__(self, needles: list[str]):
        self.needles = needles
        self.samples = 0
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            self.samples += 1
            self.hits += [ln for ln in out.splitlines() if any(n in ln for n in self.needles)]
            self._stop.wait(0.02)

    @contextmanager
    def running(self) -> Iterator[PsWatch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(30)


def secret_files(root: Path, values: list[str]) -> list[str]:
    """Every file under `root` holding one of `values` (as bytes)."""
    bad = []
    for path in root.rglob("*"):
        if path.is_file() and any(v.encode() in path.read_bytes() for v in values):
            bad.append(str(path))
    return bad


def modes(root: Path, pattern: str) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in root.rglob(pattern) if p.is_file()}


def test_server_keeps_secrets_off_ps_and_out_of_host_files(any_host: Host, tmp_path: Path) -> None:
    key = "sk-key-" + secrets.token_hex(12)
    token = "hf_tok_" + secrets.token_hex(12)
    marker = "tuner-test-" + secrets.token_hex(8)
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    spec = build_launch(
        [*SIM, "--sim-startup-seconds", "0.5"],
        {"model-path": "sim/model", "api-key": key},
        port,
        {"HF_TOKEN": token, "PLAIN": "visible"},
        str(work),
    )
    assert key not in " ".join(spec.argv) and "api-key" not in spec.flags
    log = str(work / "trial1.log")
    server = Server(any_host, T, api_key=key, marker=marker)
    watch = PsWatch([key, token])
    try:
        with watch.running():
            res = server.restart(spec, log)
            assert res.ok, res
            # the key reached SGLang through --config: requests need it
            url = f"http://127.0.0.1:{port}/get_server_info"
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(url, timeout=10)
            assert err.value.code == 401
            err.value.close()
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
            # while it runs: the secrets file and the launch script are gone, the log is private
            assert not Path(log + ".secrets.yaml").exists()
            assert modes(work, "trial1.log*") == {"trial1.log": 0o600, "trial1.log.pid": 0o600}
            assert key in Path(log).read_text()  # SGLang-style server_args, on the host, 0600
            fetched = tmp_path / "fetched.log"
            assert server.fetch_log(str(fetched))
            text = fetched.read_text()
            assert "server_args=" in text and key not in text and "***" in text
            server.stop()
        assert_group_gone(res.pgid)
    finally:
        kill_marked(marker)
    print(f"\nps sampled {watch.samples} times during start, run and stop; hits: {watch.hits}")
    assert watch.samples >= 3
    assert watch.hits == []
    assert secret_files(work, [key, token]) == []  # the log masked once the server was gone
    assert sorted(modes(work, "*")) == ["trial1.log", "trial1.log.exit", "trial1.log.pid"]
    assert set(modes(work, "*").values()) == {0o600}


@pytest.mark.ssh
def test_study_over_ssh_never_shows_a_secret(tmp_path: Path, sshd_server: Sshd) -> None:
    key = "sk-key-" + secrets.token_hex(12)
    token = "hf_tok_" + secrets.token_hex(12)
    runs = tmp_path / "runs"
    work = tmp_path / "work"
    work.mkdir()
    study = study_file(tmp_path, "secrets", n_trials=3)
    data = yaml.safe_load(study.read_text())
    data["target"].update(
        host="127.0.0.1",
        workdir=str(work),
        api_key_env="TUNER_TEST_SECRET_KEY",
        env={"HF_TOKEN": token, "PLAIN_VAR": "plain"},
        ssh={
            "user": "root",
            "port": sshd_server.port,
            "identity_file": str(sshd_server.client_key),
            "known_hosts": str(sshd_server.known_hosts),
            "ssh_config": "",
            "use_agent": False,
            "look_for_keys": False,
        },
    )
    data["baseline"] = {"mem-fraction-static": 0.85, "concurrency": 16}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    watch = PsWatch([key, token])
    with watch.running():
        out = tuner(
            "tune",
            str(study),
            "--runs-dir",
            str(runs),
            timeout=600,
            env={"TUNER_TEST_SECRET_KEY": key},
        )
    assert out.returncode == 0, out.stderr[-3000:]
    print(f"\nps sampled {watch.samples} times during the study; hits: {watch.hits}")
    assert watch.samples >= 10
    assert watch.hits == []
    assert key not in out.stdout + out.stderr and token not in out.stdout + out.stderr
    logs = list(runs.rglob("server.log"))
    assert logs and any("server_args=" in p.read_text() for p in logs)  # the key was logged
    assert secret_files(runs, [key, token]) == []
    host_files = modes(work, "*")
    assert any(n.endswith(".log") for n in host_files), host_files
    assert secret_files(work, [key, token]) == []
    leftovers = [n for n in host_files if n.endswith((".sh", ".secrets.yaml"))]
    assert leftovers == []  # removed after each server stopped
    wide = {n: f"{m:o}" for n, m in host_files.items() if m & 0o077}
    assert wide == {}, f"host files readable by others: {wide}"
