"""Each start-up failure of the simulator: SGLang's message, when it comes, the exit code."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.helpers.net import free_port
from tests.helpers.simproc import SimProc, sim_server
from tests.helpers.studies import TUNER

pytestmark = pytest.mark.slow


def run_to_exit(*flags: str, startup: str = "0.6", timeout: float = 30.0) -> tuple[int, str, float]:
    """Start the simulator, wait for it to exit; (exit code, log, seconds it ran)."""
    t0 = time.monotonic()
    proc = SimProc.start([*flags, "--sim-startup-seconds", startup])
    try:
        code = proc.wait(timeout)
        return code, proc.log(), time.monotonic() - t0
    finally:
        proc.kill()


def test_mfs_too_low_fails_after_weight_load():
    code, log, _ = run_to_exit("--sim-profile", "qwen2.5-7b-l4", "--mem-fraction-static", "0.6")
    assert code == 137
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value:"
        in log
    )
    assert log.index("Load weight end.") < log.index("Not enough memory")
    assert log.rstrip().endswith(
        "Received sigquit from a child process. It usually means the child failed."
    )
    assert "fired up" not in log


def test_mfs_too_high_fails_at_graph_capture():
    code, log, _ = run_to_exit("--mem-fraction-static", "0.98")
    assert code == 137
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in log
    assert log.index("KV Cache is allocated") < log.index("Capture cuda graph failed")
    assert "--cuda-graph-max-bs to a smaller value" in log


def test_smaller_graph_bs_moves_the_cliff():
    """The same mfs that fails with 1024-wide graphs starts with 8-wide ones."""
    code, log, _ = run_to_exit("--mem-fraction-static", "0.975", "--cuda-graph-max-bs", "1024")
    assert code == 137 and "Capture cuda graph failed" in log
    with sim_server("--mem-fraction-static", "0.975", "--cuda-graph-max-bs", "8") as sim:
        assert "fired up" in sim.log()


def test_hicache_beyond_host_ram_fails_late():
    flags = ("--sim-profile", "kimi-k2.5-tp8", "--tp", "8", "--enable-hierarchical-cache")
    code, log, took = run_to_exit(*flags, "--hicache-size", "60", startup="1.0")
    assert code == 137
    assert "ValueError: Not enough host memory available. Requesting 60.00 GB but only have" in log
    assert log.index("Capture cuda graph end") < log.index("Not enough host memory")
    assert took >= 0.85  # after (most of) the simulated load


def test_host_pool_not_larger_than_device_pool():
    code, log, _ = run_to_exit("--enable-hierarchical-cache", "--hicache-ratio", "0.5")
    assert code == 137
    assert (
        "AssertionError: The host memory should be larger than the device memory with the current protocol"
        in log
    )


def test_hicache_with_disable_radix_fails_at_once():
    code, log, took = run_to_exit(
        "--enable-hierarchical-cache", "--disable-radix-cache", startup="5"
    )
    assert code == 1
    assert (
        "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive"
        in log
    )
    assert took < 4.5 and "Load weight" not in log


def test_port_in_use_fails_after_load_with_bind_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        t0 = time.monotonic()
        proc = SimProc.start(["--sim-startup-seconds", "0.8"], port=port)
        try:
            code = proc.wait(30)
            took = time.monotonic() - t0
            log = proc.log()
        finally:
            proc.kill()
    assert code == 1
    assert (
        f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
        in log
    )
    assert log.index("max_total_num_tokens=") < log.index("Errno 98")
    assert took >= 0.7


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--hicache-size", "1.5"], "argument --hicache-size: invalid int value: '1.5'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--sim-profile", "no-such-profile"], "no-such-profile: no such simulator profile"),
    ],
)
def test_user_mistakes_exit_2(flags, fragment):
    for cmd in ([sys.executable, "-m", "tuner.sim"], [*TUNER, "sim"]):
        res = subprocess.run(
            [*cmd, "--model-path", "m", *flags], capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 2, res.stderr
        assert fragment in res.stderr and "Traceback" not in res.stderr


def test_health_503_until_ready_then_sigterm_drains():
    proc = SimProc.start(["--sim-startup-seconds", "3"])  # seconds of 503 to poll into
    try:
        seen = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and 200 not in seen:
            status = proc.health()
            if status is not None:
                seen.add(status)
            time.sleep(0.05)
        assert seen == {503, 200}
        assert "The server is fired up and ready to roll!" in proc.log()
        # a long request in flight when SIGTERM arrives is finished, not dropped
        result: dict = {}

        def long_request() -> None:
            body = (
                b'{"text": "a b c", "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}'
            )
            with urllib.request.urlopen(proc.url + "/generate", data=body, timeout=60) as resp:
                result["status"] = resp.status
                result["body"] = resp.read()

        ready_at = len(proc.log())
        worker = threading.Thread(target=long_request)
        worker.start()
        # SIGTERM once the server has the request (its prefill is logged), not after a fixed
        # delay a busy machine may need just to send it; 400 tokens then take ~3 s to decode
        deadline = time.monotonic() + 30
        while "Prefill batch" not in proc.log()[ready_at:]:
            assert time.monotonic() < deadline and worker.is_alive(), proc.log()[ready_at:]
            time.sleep(0.02)
        proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (status := proc.health()) == 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the server has handled the signal
        assert status == 503  # draining: not gone, not serving new work
        worker.join(60)
        assert proc.wait(30) == 0
        assert result.get("status") == 200 and b'"completion_tokens": 400' in result["body"]
        assert (
            "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
            in proc.log()
        )
    finally:
        proc.kill()


def test_prefill_oom_in_the_band_kills_the_server_under_load():
    # kimi at mfs 0.93: graphs fit, a full 8192-token prefill batch does not
    with sim_server(
        "--sim-profile", "kimi-k2.5-tp8", "--tp", "8", "--mem-fraction-static", "0.93"
    ) as sim:
        assert "fired up" in sim.log()
        small = b'{"text": "hello there", "sampling_params": {"max_new_tokens": 2}}'
        with urllib.request.urlopen(sim.url + "/generate", data=small, timeout=30) as resp:
            assert resp.status == 200
        ids = ",".join(["7"] * 6000)
        big = f'{{"input_ids": [{ids}], "sampling_params": {{"max_new_tokens": 4}}}}'.encode()
        with contextlib.suppress(OSError):  # the connection dies with the server
            urllib.request.urlopen(sim.url + "/generate", data=big, timeout=30).read()
        assert sim.wait(30) == 137
        log = sim.log()
        assert "Prefill out of memory. Try to lower your batch size." in log
        assert log.rstrip().endswith(
            "Received sigquit from a child process. It usually means the child failed."
        )


def test_free_port_helper_gives_distinct_ports():
    assert free_port() != 0


def test_sigterm_during_startup_exits_promptly():
    proc = SimProc.start(["--sim-startup-seconds", "20"])
    try:
        deadline = time.monotonic() + 20
        while proc.health() != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - t0 < 5
        assert "SIGTERM received" in proc.log() and "fired up" not in proc.log()
    finally:
        proc.kill()
