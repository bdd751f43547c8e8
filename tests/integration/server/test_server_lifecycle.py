"""Server lifecycle over LocalHost and SSHHost (real sshd): start, ready, verify, restart, stop,
every failure class, deadlines, a dropped connection, PID reuse, hostile values.

The server is tests/helpers/fake_sglang.py (a stand-in speaking SGLang's HTTP API and failure
lines); the last tests run the same cycle against the real `tuner sim`.
After every test no process of the groups it started is left (asserted by pgid).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import HELPERS
from tests.helpers.sshd import assert_group_gone
from tuner.config.target import Timeouts
from tuner.errors import PortHeldError
from tuner.hosts import Host, SSHHost
from tuner.server.gpus import gpu_memory_of
from tuner.server.launch import LaunchSpec
from tuner.server.lifecycle import Server
from tuner.server.records import GpuMemory
from tuner.server.target import Launch

FAKE = str(HELPERS / "fake_sglang.py")
FAST = Timeouts(ready_s=20, stop_s=5, port_free_s=3, gpu_free_s=5, poll_s=0.05, http_s=2)

pytestmark = pytest.mark.slow


def alive(server: Server) -> bool:
    """The server we started last still has a live process group."""
    return server.pgid is not None and server.host.group_alive(server.pgid)


def fake_spec(port: int, mfs: float = 0.8, *extra: str, model: str = "fake/model") -> LaunchSpec:
    argv = (sys.executable, FAKE, "--model-path", model, "--port", str(port))
    argv += ("--mem-fraction-static", str(mfs), *extra)
    return LaunchSpec(argv=argv, port=port, flags={"model-path": model, "mem-fraction-static": mfs})


class Tracker:
    """A Server whose every started group is checked gone at teardown."""

    def __init__(self, host: Host, tmp_path: Path, timeouts: Timeouts = FAST, **kw: object):
        self.server = Server(host, timeouts, **kw)  # type: ignore[arg-type]
        self.tmp = tmp_path
        self.pgids: list[int] = []
        self.n = 0

    def restart(self, spec: LaunchSpec):
        self.n += 1
        res = self.server.restart(spec, str(self.tmp / "logs" / f"server-{self.n}.log"))
        if res.pgid is not None:
            self.pgids.append(res.pgid)
        return res

    def cleanup(self) -> None:
        try:
            self.server.stop()
        finally:
            for g in self.pgids:
                try:
                    assert_group_gone(g)
                except AssertionError:
                    os.killpg(g, signal.SIGKILL)
                    raise


@pytest.fixture
def tracker(any_host: Host, tmp_path: Path) -> Iterator[Tracker]:
    t = Tracker(any_host, tmp_path)
    try:
        yield t
    finally:
        t.cleanup()


def test_start_ready_verify_restart_stop(tracker: Tracker, tmp_path: Path) -> None:
    port = free_port()
    r1 = tracker.restart(fake_spec(port, 0.8, "--fake-child"))
    assert r1.ok, r1
    assert (r1.failure, r1.mem_fraction_static, r1.max_total_num_tokens) == (None, 0.8, 1_600_000)
    assert r1.max_running_requests == 800_000 and r1.version == "0.5.6.post2"
    assert r1.server_pid in tracker.server.host.group_pids(r1.pgid)
    assert alive(tracker.server) and tracker.server.check() is None
    t = r1.timings
    assert 0 < t.start_to_ready_s < t.total_s and t.overhead_s >= 0

    r2 = tracker.restart(fake_spec(port, 0.7))
    assert r2.ok, r2
    assert r2.mem_fraction_static == 0.7 and r2.pgid != r1.pgid
    assert r2.timings.stop_s > 0
    assert_group_gone(r1.pgid)  # the old server and its child are gone

    local = tmp_path / "copy.log"
    assert tracker.server.fetch_log(str(local))
    assert json.loads(local.read_text().splitlines()[0])[:2] == ["--model-path", "fake/model"]
    assert tracker.server.stop() > 0
    assert not alive(tracker.server)
    assert_group_gone(r2.pgid)


def test_the_simulators_host_reads_its_gpus_as_nvidia_smi(any_host: Host, tmp_path: Path) -> None:
    """A simulator launch's host has the simulated nvidia-smi (Launch.nvidia_smi): the GPU
    facts, the memory in use while it serves, and the stop's wait until its pid holds none."""
    port = free_port()
    launch = Launch((sys.executable, "-m", "tuner.sim", "--sim-profile", "llama-3.1-8b-h100"), {})
    t = Tracker(any_host, tmp_path, nvidia_smi=launch.nvidia_smi(port))
    try:
        res = t.restart(sim_spec(port, "--mem-fraction-static", "0.85"))
        assert res.ok, res
        assert [(g.name, g.memory_total_mib) for g in res.gpus] == [
            ("NVIDIA H100 80GB HBM3", 81559)
        ]
        reading = t.server.gpu_memory()
        assert reading is not None and reading.total_mib == 81559.0
        assert 0.85 * 81559 < reading.used_mib < 81559  # the pool, weights, graphs, a warm-up
        t.server.stop()  # waits until nvidia-smi lists none of its pids
        assert_group_gone(res.pgid)
        assert t.server.gpu_memory() == GpuMemory(0.0, 81559.0)
    finally:
        t.cleanup()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--fake-fail", "oom_cuda_graph"), "oom_cuda_graph"),
        (("--fake-fail", "not_enough_memory"), "not_enough_memory"),
        (("--fake-fail", "host_memory"), "host_memory"),
        (("--fake-fail", "port_in_use"), "port_in_use"),
        (("--fake-fail", "crashed"), "crashed"),
        (("--no-such-flag", "1"), "bad_flag"),
        (("--max-running-requests", "1.5"), "bad_flag"),
    ],
)
def test_failure_classes(tracker: Tracker, extra: tuple[str, ...], expected: str) -> None:
    t0 = time.monotonic()
    res = tracker.restart(fake_spec(free_port(), 0.8, *extra))
    assert not res.ok
    assert res.failure == expected, res
    assert res.reason and "\n" not in res.reason
    assert res.evidence  # the log lines that show it
    assert time.monotonic() - t0 < FAST.ready_s / 2  # early death seen at once, not at the deadline
    assert not alive(tracker.server)


def test_bad_flag_has_exit_code_2(tracker: Tracker) -> None:
    res = tracker.restart(fake_spec(free_port(), 0.8, "--no-such-flag"))
    assert (res.failure, res.exit_code) == ("bad_flag", 2)
    assert "unrecognized arguments: --no-such-flag" in res.reason


def test_hanging_start_hits_the_deadline_and_is_killed(any_host: Host, tmp_path: Path) -> None:
    # 3 s: time for the fake to print its first lines (the evidence) on a busy machine
    t = Tracker(any_host, tmp_path, Timeouts(ready_s=3, stop_s=2, poll_s=0.05, http_s=1))
    try:
        t0 = time.monotonic()
        res = t.restart(fake_spec(free_port(), 0.8, "--fake-hang", "--fake-child"))
        assert res.failure == "timeout" and not res.ok
        assert 3 <= time.monotonic() - t0 < 20  # the deadline, then TERM and KILL (2 s)
        assert any("Load weight end" in ln for ln in res.evidence)
        assert not any_host.group_alive(res.pgid)
    finally:
        t.cleanup()


def test_stop_escalates_to_kill(any_host: Host, tmp_path: Path) -> None:
    t = Tracker(any_host, tmp_path, Timeouts(ready_s=20, stop_s=0.5, poll_s=0.05, http_s=1))
    try:
        res = t.restart(fake_spec(free_port(), 0.8, "--fake-ignore-term"))
        assert res.ok, res
        took = t.server.stop()
        assert took >= 0.5
        assert not any_host.group_alive(res.pgid)
    finally:
        t.cleanup()


def test_port_taken_by_someone_else_stops_the_study(tracker: Tracker) -> None:
    """Not the configuration's failure: a HaltError naming the holder (here: this process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortHeldError, match=rf"port {port} is held by PID {os.getpid()} "):
            tracker.restart(fake_spec(port))
    assert tracker.server.pgid is None  # nothing was started


def test_death_after_ready_is_classified(tracker: Tracker) -> None:
    res = tracker.restart(fake_spec(free_port(), 0.8, "--fake-die-after", "3"))
    assert res.ok, res
    end = time.monotonic() + 15
    while (death := tracker.server.check()) is None:
        assert time.monotonic() < end, "death not noticed"
        time.sleep(0.1)
    assert death.failure == "oom_runtime" and death.exit_code == 137
    assert "Prefill out of memory" in death.reason


def test_args_mismatch(tracker: Tracker) -> None:
    res = tracker.restart(fake_spec(free_port(), 0.8, "--fake-report-mfs", "0.6"))
    assert res.failure == "args_mismatch"
    assert res.reason == "mem-fraction-static: asked 0.8, server has 0.6"


def test_answering_server_is_not_ours(tracker: Tracker) -> None:
    res = tracker.restart(fake_spec(free_port(), 0.8, "--fake-report-pid", "1"))
    assert res.failure == "stale_server"
    assert not alive(tracker.server)


def test_another_tenants_server_answering_our_port_is_never_ours(
    tracker: Tracker, tmp_path: Path
) -> None:
    """Two workers on one host and port: ours fails to bind while the other's answers /health
    200 with the same flags and, as SGLang, no pid. Trusting it measured the other's server and
    recorded false args mismatches; the port's listener shows it is not in our group."""
    pid_file = tmp_path / "foreign.pid"
    spec = fake_spec(free_port(), 0.8, "--fake-no-pid", "--fake-foreign", str(pid_file))
    try:
        res = tracker.restart(spec)
        assert not res.ok, res
        assert res.failure in ("port_in_use", "stale_server"), res
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def test_reused_pid_is_not_killed(any_host: Host, tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        server = Server(any_host, FAST)
        server.adopt(other.pid, "python3 launch_server.py --port 1", str(tmp_path / "x.log"), 1)
        server.stop()
        assert other.poll() is None  # the group's leader runs something else: left alone
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_hostile_model_path_is_one_argument(tracker: Tracker, tmp_path: Path) -> None:
    victim = Path(f"/tmp/owned-{secrets.token_hex(6)}")
    model = f"x; touch {victim}"
    res = tracker.restart(fake_spec(free_port(), 0.8, model=model))
    assert res.ok, res
    local = tmp_path / "log"
    tracker.server.fetch_log(str(local))
    argv = json.loads(local.read_text().splitlines()[0])
    assert argv[argv.index("--model-path") + 1] == model
    assert not victim.exists()


def test_gpu_facts_from_nvidia_smi(any_host: Host, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$1" in --query-gpu=*) printf \'NVIDIA H100 80GB HBM3, 81559\\n'
        "NVIDIA H100 80GB HBM3, 81559\\n';; esac\n"
    )
    smi.chmod(0o755)
    t = Tracker(any_host, tmp_path, nvidia_smi=str(smi))
    try:
        r1 = t.restart(fake_spec(free_port()))
        assert r1.ok and len(r1.gpus) == 2
        assert (r1.gpus[0].name, r1.gpus[0].memory_total_mib) == ("NVIDIA H100 80GB HBM3", 81559)
        r2 = t.restart(fake_spec(r1.timings and free_port()))  # the stop waits on the GPU query
        assert r2.ok
    finally:
        t.cleanup()


def test_gpu_memory_in_use_from_nvidia_smi(any_host: Host, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        "  --query-gpu=name,*) printf 'H20, 97887\\nH20, 97887\\n';;\n"
        "  --query-gpu=memory.used,*) printf '91000, 97887\\n93500, 97887\\n';;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    t = Tracker(any_host, tmp_path, nvidia_smi=str(smi))
    try:
        assert t.restart(fake_spec(free_port())).ok
        # the busiest GPU of the host: the one whose load leaves least room
        assert t.server.gpu_memory() == GpuMemory(93500.0, 97887.0)
    finally:
        t.cleanup()
    bare = Tracker(any_host, tmp_path, nvidia_smi=str(tmp_path / "absent"))
    try:
        assert bare.server.gpu_memory() is None  # no nvidia-smi: nothing read, nothing predicted
    finally:
        bare.cleanup()


@pytest.mark.ssh
def test_dropped_connection_during_the_wait_is_survived(sshd_server, tmp_path: Path) -> None:
    host = SSHHost(sshd_server.options())
    t = Tracker(host, tmp_path)
    try:
        host.run(["true"])
        first = host.transport()
        timer = threading.Timer(0.5, first.close)  # the connection dies while we poll
        timer.start()
        res = t.restart(fake_spec(free_port(), 0.8, "--fake-startup", "2"))
        timer.join()
        assert res.ok, res
        assert host.transport() is not first  # it reconnected
    finally:
        t.cleanup()
        host.close()


# -- the real simulator (`python -m tuner.sim`) ---------------------------------------------

SIM_STARTUP = 1.0


def sim_spec(port: int, *extra: str, flags: dict | None = None) -> LaunchSpec:
    argv = (sys.executable, "-m", "tuner.sim", "--model-path", "sim/model", "--port", str(port))
    argv += ("--sim-profile", "llama-3.1-8b-h100", "--sim-startup-seconds", str(SIM_STARTUP))
    return LaunchSpec(argv=(*argv, *extra), port=port, flags=flags or {}, cwd="/")


def test_restart_cycle_on_the_simulator(tracker: Tracker) -> None:
    """stop, start, ready, verify on `tuner sim`; the tuner's own share of each restart."""
    port = free_port()
    results = []
    for mfs in (0.8, 0.85, 0.8):
        flags = {"mem-fraction-static": mfs, "schedule-policy": "lpm"}
        res = tracker.restart(
            sim_spec(
                port, "--mem-fraction-static", str(mfs), "--schedule-policy", "lpm", flags=flags
            )
        )
        assert res.ok, res
        assert res.mem_fraction_static == mfs and res.version
        assert res.max_running_requests and res.max_total_num_tokens
        results.append(res)
    # a larger static fraction buys a larger KV pool; the same flags give the same pool
    assert results[1].max_total_num_tokens > results[0].max_total_num_tokens
    assert results[2].max_total_num_tokens == results[0].max_total_num_tokens
    for r in results[:-1]:
        assert_group_gone(r.pgid)
    tracker.server.stop()
    assert_group_gone(results[-1].pgid)
    # the second and third restarts include stopping the previous server (SIGTERM drain)
    for r in results:
        t = r.timings
        print(
            f"\n{tracker.server.host.name}: restart total {t.total_s:.2f} s, stop {t.stop_s:.2f}, "
            f"start->ready {t.start_to_ready_s:.2f} (sim start-up {SIM_STARTUP}), "
            f"overhead {t.overhead_s:.2f}, beyond start-up {t.total_s - SIM_STARTUP:.2f}"
        )
        assert t.start_to_ready_s >= SIM_STARTUP
        assert t.overhead_s < 15  # generous: 2 shared cores under a parallel test load


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--mem-fraction-static", "0.1"), "not_enough_memory"),
        (("--mem-fraction-static", "0.99"), "oom_cuda_graph"),
        (("--enable-hierarchical-cache", "--hicache-size", "100000"), "host_memory"),
        (("--hicache-size", "1.5"), "bad_flag"),
    ],
)
def test_simulator_failures_are_classified(
    tracker: Tracker, extra: tuple[str, ...], expected: str
) -> None:
    res = tracker.restart(sim_spec(free_port(), *extra))
    assert (res.ok, res.failure) == (False, expected), res
    assert res.evidence and res.exit_code in (1, 2, 137)


def test_nvidia_smis_memory_rows_read_as_the_busiest_gpu() -> None:
    assert gpu_memory_of("1000, 80000\n79000, 81559\n") == GpuMemory(79000.0, 80000.0)
    assert gpu_memory_of("[N/A], [N/A]\n500, 24000\n") == GpuMemory(500.0, 24000.0)
    assert gpu_memory_of("") is None and gpu_memory_of("No devices were found\n") is None
