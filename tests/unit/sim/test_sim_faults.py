"""`--sim-fault` specs, seeded draws across launches, the launch counter, and `--port` checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.studies import tuner
from tuner.errors import InputFileError
from tuner.sglang.failures import explain_failure, is_config_failure
from tuner.sim.__main__ import main
from tuner.sim.faults import Faults, fired_line, next_launch_index
from tuner.sim.faultspec import KEYS, FaultSpec, parse_fault
from tuner.sim.flags import FlagError, parse_flags


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("crash-start", FaultSpec("crash-start")),
        ("crash-start:at=0.2,p=0.5", FaultSpec("crash-start", p=0.5, at=0.2)),
        ("hang-start:at=1", FaultSpec("hang-start", at=1.0)),
        ("slow-start:s=2.5", FaultSpec("slow-start", s=2.5)),
        ("crash-load", FaultSpec("crash-load", requests=1)),
        ("crash-load:after=3,requests=0", FaultSpec("crash-load", after=3.0, requests=0)),
        ("hang-load:how=stop,requests=5", FaultSpec("hang-load", requests=5, how="stop")),
        ("cut-stream:rate=1,tokens=4", FaultSpec("cut-stream", rate=1.0, tokens=4)),
        ("http-5xx:status=503,rate=0.1", FaultSpec("http-5xx", status=503, rate=0.1)),
        ("health-flap:rate=0.5,after=1", FaultSpec("health-flap", rate=0.5, after=1.0)),
        (" http-5xx : p = 0 , rate = 1 ", FaultSpec("http-5xx", p=0.0, rate=1.0)),
        ("cut-stream:", FaultSpec("cut-stream")),
    ],
)
def test_good_specs(text: str, expected: FaultSpec) -> None:
    assert parse_fault(text) == expected


def test_every_kind_round_trips_through_describe() -> None:
    for kind in KEYS:
        spec = parse_fault(kind)
        assert parse_fault(spec.describe()) == spec


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("crash", "unknown fault kind 'crash'"),
        ("", "unknown fault kind ''"),
        ("crash-load:x=1", "unknown key 'x'"),
        ("crash-start:after=1", "unknown key 'after'"),  # start kinds take at=
        ("slow-start:at=0.5", "unknown key 'at'"),
        ("crash-load:p", "expected key=value"),
        ("crash-load:p=", "expected key=value"),
        ("crash-load:p=1.5", "p=1.5: must be between 0 and 1"),
        ("crash-load:p=-0.1", "must be between 0 and 1"),
        ("crash-load:p=nan", "must be finite"),
        ("crash-load:p=abc", "not a number"),
        ("crash-load:after=-1", "must be >= 0 seconds"),
        ("crash-load:after=inf", "must be finite"),
        ("slow-start:s=-2", "must be >= 0 seconds"),
        ("crash-load:requests=-1", "must be >= 0"),
        ("crash-load:requests=1.5", "not an integer"),
        ("cut-stream:tokens=0", "must be >= 1"),
        ("http-5xx:status=404", "must be between 500 and 599"),
        ("http-5xx:rate=2", "must be between 0 and 1"),
        ("hang-load:how=pause", "expected one of block, stop"),
        ("crash-load:p=0.5,p=0.6", "p given twice"),
    ],
)
def test_bad_specs(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_fault(text)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(FlagError) as flag_err:
        parse_flags(["--model-path", "m", "--sim-fault", text])
    assert flag_err.value.message.startswith("launch_server.py: error: argument --sim-fault: ")


def test_bad_spec_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model-path", "m", "--sim-fault", "crash-load:p=7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "p=7" in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["99999", "65536", "0", "-1", "abc"])
def test_out_of_range_port_is_an_argparse_error(port: str) -> None:
    with pytest.raises(FlagError) as err:
        parse_flags(["--model-path", "m", "--port", port])
    assert "argument --port: invalid" in err.value.message


def test_valid_ports_still_parse() -> None:
    assert parse_flags(["--model-path", "m", "--port", "65535"]).port == 65535
    assert parse_flags(["--model-path", "m"]).port == 30000


def test_tuner_sim_port_99999_via_the_cli(tmp_path: Path) -> None:
    """`tuner sim --port 99999`: one line, exit 2, no traceback, nothing written."""
    proc = tuner("sim", "--model-path", "m", "--port", "99999", timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--port" in proc.stderr, proc.stderr
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_faults_default_to_none() -> None:
    ns = parse_flags(["--model-path", "m"])
    assert ns.sim_fault == [] and ns.sim_fault_state is None
    f = Faults()
    assert f.summary() is None and f.extra_startup_s == 0 and f.start_fault() is None
    f.mark_ready(0.0)
    f.on_request()
    assert f.http_error(100.0, print) is None and not f.health_fails(100.0, print)


def _armed(p: float, seed: int, launch: int) -> bool:
    return bool(Faults([FaultSpec("crash-load", p=p)], seed, launch).armed)


def test_arming_is_reproducible_and_varies_across_launches() -> None:
    runs = [[_armed(0.5, 42, launch) for launch in range(200)] for _ in range(2)]
    assert runs[0] == runs[1]  # same seed and launch: same decision
    share = sum(runs[0]) / 200
    assert 0.35 < share < 0.65  # p=0.5 arms about half the launches
    assert runs[0] != [_armed(0.5, 43, launch) for launch in range(200)]  # the seed matters
    assert all(_armed(1.0, 1, n) for n in range(50))
    assert not any(_armed(0.0, 1, n) for n in range(50))


def test_faults_draw_independently_of_each_other() -> None:
    one = Faults([FaultSpec("http-5xx", p=0.5)], 7, 3)
    two = Faults([FaultSpec("http-5xx", p=0.5), FaultSpec("crash-load", p=0.5)], 7, 3)
    assert one.draws[0] == two.draws[0]


def _hits(seed: int, launch: int, n: int = 200) -> list[int | None]:
    f = Faults([FaultSpec("http-5xx", rate=0.3, status=503)], seed, launch)
    f.mark_ready(0.0)
    out = []
    for _ in range(n):
        f.on_request()
        out.append(f.http_error(1.0, lambda _: None))
    return out


def test_per_request_draws_are_seeded() -> None:
    a, b = _hits(5, 0), _hits(5, 0)
    assert a == b
    assert set(a) == {None, 503} and 30 < a.count(503) < 90
    assert _hits(5, 1) != a


def test_per_request_faults_wait_for_after_and_requests() -> None:
    f = Faults([FaultSpec("http-5xx", rate=1.0, after=2.0, requests=3)], 0, 0)
    log: list[str] = []
    assert f.http_error(10.0, log.append) is None  # not ready yet
    f.mark_ready(10.0)
    for _ in range(3):
        f.on_request()
        assert f.http_error(11.0, log.append) is None  # before after=2
    assert f.http_error(12.5, log.append) == 500
    assert log == ["[sim-fault] http-5xx fired (occurrence 1)"]


def test_per_request_firings_are_logged_sparsely() -> None:
    f = Faults([FaultSpec("health-flap", rate=1.0)], 0, 0)
    f.mark_ready(0.0)
    log: list[str] = []
    for _ in range(20):
        assert f.health_fails(1.0, log.append)
    assert [line.rsplit(" ", 1)[1] for line in log] == ["1)", "2)", "4)", "8)", "16)"]


def test_start_faults_and_slow_start() -> None:
    f = Faults(
        [
            FaultSpec("slow-start", s=2.0),
            FaultSpec("hang-start", at=0.7),
            FaultSpec("crash-start", at=0.3),
            FaultSpec("slow-start", s=1.0, p=0.0),
        ],
        0,
        0,
    )
    assert f.extra_startup_s == 2.0
    assert f.start_fault() == FaultSpec("crash-start", at=0.3)  # the earliest fires
    summary = f.summary()
    assert summary is not None and summary.startswith("[sim-fault] launch 0: slow-start:")
    assert summary.count(" armed (") == 4 and summary.count("not armed") == 1


def test_launch_counter(tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    assert [next_launch_index(path) for _ in range(4)] == [0, 1, 2, 3]
    assert Path(path).read_text() == "4\n"


def test_launch_counter_is_atomic_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "state"
    code = f"from tuner.sim.faults import next_launch_index as n; print(n({str(path)!r}))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    got = sorted(int(p.communicate(timeout=60)[0]) for p in procs)
    assert got == list(range(6))


@pytest.mark.parametrize("content", ["abc", "-3", "1.5"])
def test_launch_counter_rejects_garbage(tmp_path: Path, content: str) -> None:
    path = tmp_path / "state"
    path.write_text(content)
    with pytest.raises(InputFileError, match="not a counter"):
        next_launch_index(str(path))
    assert path.read_text() == content  # not replaced


def test_launch_counter_in_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot open"):
        next_launch_index(str(tmp_path / "no" / "state"))


@pytest.mark.parametrize("kind", list(KEYS))
def test_fired_lines_are_never_sglang_evidence(kind: str) -> None:
    """A fault is the world's failure: its log line must not classify as the configuration's."""
    spec = parse_fault(kind)
    lines = [fired_line(spec), f"[sim-fault] {kind} fired (occurrence 1)"]
    lines.append(Faults([spec], 0, 0).summary() or "")
    for code in (None, -9, 137, 1):
        cls, _ = explain_failure(code, lines)
        assert not is_config_failure(cls), (kind, code, cls)


def test_a_fifo_is_refused_not_read_forever(tmp_path) -> None:
    import os

    from tuner.errors import InputFileError
    from tuner.sim.faults import next_launch_index
    from tuner.sim.flags import build_parser, config_to_argv

    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="FIFO"):
        next_launch_index(str(fifo))
    with pytest.raises(InputFileError, match="FIFO"):
        config_to_argv(str(fifo), build_parser())
