"""Each `--sim-fault` observed over real HTTP against the simulator as a real subprocess.

Every wait is bounded; timings are asserted only as lower bounds or generous upper bounds.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.helpers.simproc import SimProc, sim_server
from tuner.sglang.failures import FailureClass, explain_failure, is_config_failure

pytestmark = pytest.mark.slow


def _generate(url: str, stream: bool, tokens: int = 12, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of one /generate; raises on a broken connection or a timeout."""
    body = {
        "text": "hello fault",
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        "stream": stream,
    }
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _run_until_exit(flags: list[str], timeout: float = 30.0) -> tuple[int, str]:
    proc = SimProc.start(flags)
    try:
        return proc.wait(timeout), proc.log()
    finally:
        proc.kill()


def _assert_world_failure(code: int, log: str) -> None:
    cls, line = explain_failure(code, log.splitlines()[-50:])
    assert cls == FailureClass.CRASHED and not is_config_failure(cls), (cls, line)


def test_no_fault_no_fault_output() -> None:
    with sim_server("--sim-seed", "3") as sim:
        assert _generate(sim.url, stream=True)[0] == 200
        assert "[sim-fault]" not in sim.log()


def test_p_zero_arms_nothing() -> None:
    with sim_server("--sim-fault", "crash-load:p=0,requests=1", "--sim-seed", "3") as sim:
        for _ in range(3):
            assert _generate(sim.url, stream=False)[0] == 200
        assert sim.popen.poll() is None
        assert "crash-load:p=0.0,after=0.0,requests=1 not armed" in sim.log()
        assert "crash-load fired" not in sim.log()


def test_crash_start_dies_without_sglang_message() -> None:
    code, log = _run_until_exit(["--sim-fault", "crash-start:at=0.5"])
    assert code == -signal.SIGKILL
    assert "[sim-fault] crash-start fired" in log and "fired up" not in log
    assert "Scheduler hit" not in log and "sigquit" not in log
    _assert_world_failure(code, log)


def test_hang_start_stays_alive_never_ready_until_sigterm() -> None:
    proc = SimProc.start(["--sim-fault", "hang-start:at=0.2"])
    try:
        deadline = time.monotonic() + 20
        while "hang-start fired" not in proc.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "[sim-fault] hang-start fired" in proc.log()
        for _ in range(5):  # well past the 0.3 s start-up
            assert proc.health() == 503
            time.sleep(0.2)
        assert proc.popen.poll() is None and "fired up" not in proc.log()
        proc.signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()


def test_slow_start_takes_longer() -> None:
    t0 = time.monotonic()
    with sim_server("--sim-fault", "slow-start:s=1.5") as sim:
        took = time.monotonic() - t0
        assert took >= 1.5, took  # 0.3 s start-up + 1.5 s
        assert "slow-start:p=1.0,s=1.5 armed" in sim.log()


def test_crash_load_dies_mid_load() -> None:
    proc = SimProc.start(["--sim-fault", "crash-load:requests=2"])
    try:
        proc.wait_ready()
        assert _generate(proc.url, stream=True)[0] == 200  # request 1 is served
        with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
            _generate(proc.url, stream=True)  # request 2 kills it
        code = proc.wait(10)
        log = proc.log()
        assert code == -signal.SIGKILL and "[sim-fault] crash-load fired" in log
        _assert_world_failure(code, log)
    finally:
        proc.kill()


@pytest.mark.parametrize("how", ["block", "stop"])
def test_hang_load_stops_answering_but_stays_alive(how: str) -> None:
    proc = SimProc.start(["--sim-fault", f"hang-load:after=0.2,requests=0,how={how}"])
    try:
        proc.wait_ready()
        deadline = time.monotonic() + 20
        while "hang-load fired" not in proc.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "[sim-fault] hang-load fired" in proc.log()
        time.sleep(0.2)
        assert proc.health(timeout=1.0) is None  # nothing answers, not even /health
        with pytest.raises((TimeoutError, urllib.error.URLError, OSError)):
            _generate(proc.url, stream=False, timeout=1.0)
        status = psutil.Process(proc.popen.pid).status()
        assert status == (psutil.STATUS_STOPPED if how == "stop" else psutil.STATUS_SLEEPING)
        proc.signal(signal.SIGTERM)  # a hung server ignores SIGTERM: only SIGKILL ends it
        time.sleep(0.5)
        assert proc.popen.poll() is None
    finally:
        proc.kill()
    assert proc.popen.returncode == -signal.SIGKILL


async def _stream(url: str, path: str, body: dict) -> tuple[bytes, BaseException | None]:
    """What a streamed response delivered before it ended, and the error it ended with."""
    got = b""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.post(url + path, json=body) as resp:
                assert resp.status == 200
                async for chunk in resp.content.iter_any():
                    got += chunk
        except aiohttp.ClientError as exc:
            return got, exc
    return got, None


def test_cut_stream_closes_mid_body() -> None:
    with sim_server("--sim-fault", "cut-stream:rate=1,tokens=3", "--sim-seed", "1") as sim:
        native = {
            "text": "cut me",
            "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
            "stream": True,
        }
        got, err = asyncio.run(_stream(sim.url, "/generate", native))
        assert isinstance(err, aiohttp.ClientPayloadError), err
        assert got.startswith(b"data: {") and b"[DONE]" not in got
        assert b'"completion_tokens":20' not in got
        chat = {
            "messages": [{"role": "user", "content": "cut me too"}],
            "max_tokens": 20,
            "stream": True,
        }
        got, err = asyncio.run(_stream(sim.url, "/v1/chat/completions", chat))
        assert isinstance(err, aiohttp.ClientPayloadError), err
        assert b'"finish_reason":"length"' not in got and b"[DONE]" not in got
        # a short answer is cut before its last chunk too
        short = {**native, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
        got, err = asyncio.run(_stream(sim.url, "/generate", short))
        assert isinstance(err, aiohttp.ClientPayloadError) and b"[DONE]" not in got
        # non-streamed requests and the server itself are unaffected
        assert _generate(sim.url, stream=False)[0] == 200
        assert sim.popen.poll() is None and sim.health() == 200
        assert "[sim-fault] cut-stream fired (occurrence 1)" in sim.log()


def test_http_5xx_answers_some_requests_with_errors() -> None:
    with sim_server("--sim-fault", "http-5xx:rate=0.5,status=503", "--sim-seed", "11") as sim:
        statuses = [_generate(sim.url, stream=False, tokens=2)[0] for _ in range(30)]
        print(f"http-5xx rate 0.5: {statuses.count(503)} of 30 answered 503")
        assert set(statuses) == {200, 503}
        assert sim.health() == 200
        assert "[sim-fault] http-5xx fired" in sim.log()


def test_http_5xx_openai_shape() -> None:
    with sim_server("--sim-fault", "http-5xx:rate=1") as sim:
        req = urllib.request.Request(
            sim.url + "/v1/completions",
            json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 500
        assert json.loads(err.value.read())["object"] == "error"


def test_health_flap_after_ready() -> None:
    # not sim_server(): its readiness poll would trip over the flapping
    proc = SimProc.start(["--sim-fault", "health-flap:rate=0.5", "--sim-seed", "5"])
    try:
        deadline = time.monotonic() + 20
        while "ready to roll" not in proc.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        codes = [proc.health() for _ in range(30)]
        print(f"health-flap rate 0.5: {codes.count(503)} of 30 probes answered 503")
        assert set(codes) == {200, 503}
        assert _generate(proc.url, stream=False)[0] == 200  # requests still served
    finally:
        proc.kill()


def test_launch_counter_changes_decisions_reproducibly(tmp_path: Path) -> None:
    state = tmp_path / "fault-state"
    flags = ["--sim-fault", "crash-start:p=0.5", "--sim-seed", "9", "--sim-fault-state", str(state)]
    lines = []
    for _ in range(3):
        proc = SimProc.start([*flags, "--sim-startup-seconds", "0.1"])
        try:
            deadline = time.monotonic() + 20
            while "[sim-fault] launch" not in proc.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            line = next(ln for ln in proc.log().splitlines() if "[sim-fault] launch" in ln)
            lines.append(line.split("] ", 1)[1])
        finally:
            proc.kill()
    assert [ln.split(":")[0] for ln in lines] == [f"[sim-fault] launch {i}" for i in range(3)]
    assert state.read_text() == "3\n"
    # the same seed and launch index decide the same: draws match a fresh computation
    from tuner.sim.faults import Faults
    from tuner.sim.faultspec import parse_fault

    spec = parse_fault("crash-start:p=0.5")
    for i, line in enumerate(lines):
        assert line == Faults([spec], 9, i).summary()
