"""The pure parts of `tuner check`: parsing what the host printed, the study's far ends, the
plan's skips, the aligned output."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.studies import REPO
from tuner.capacity import calculus as cap
from tuner.capacity.calculus import Parallel
from tuner.check.lines import FAIL, OK, SKIP, CheckLine, fail, ok, render
from tuner.check.machine import hicache_limit, parse_apps, parse_gpus, parse_meminfo
from tuner.check.plan import Check, _run
from tuner.check.probe import Probe
from tuner.check.reading import capacity
from tuner.check.sglang import python_module, study_flags, version_package
from tuner.check.spacefacts import largest_parallel, model_path, values_of
from tuner.config.load import parse_study
from tuner.errors import SetupError
from tuner.server.target import Launch


def demo(**server: object) -> dict:
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["server"].update(server)
    return data


def test_nvidia_smi_lines() -> None:
    gpus = parse_gpus("0, NVIDIA H100 80GB HBM3, 81559, 81000\n1, Odd, Name, 100, [N/A]\nbad\n")
    assert [(g.index, g.name, g.total_mib, g.free_mib) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559.0, 81000.0)
    ]
    assert parse_apps("4242, python3, 70000\n\n") == [(4242, "python3", "70000")]
    assert parse_apps("") == []


def test_meminfo_and_the_largest_hicache_size() -> None:
    info = parse_meminfo("MemTotal:  104857600 kB\nMemAvailable: 52428800 kB\nHugePages_Total: 0\n")
    assert info["MemTotal"] == 100 * cap.GIB and info["MemAvailable"] == 50 * cap.GIB
    # capacity's own formula (10 GiB reserve) on what is left after the margin, per rank
    assert hicache_limit(info["MemAvailable"], info["MemTotal"], 1) == (
        cap.max_hicache_gb_per_rank(45 * cap.GIB)
    )
    assert hicache_limit(50 * cap.GIB, 100 * cap.GIB, 4) == 9  # 35 GiB over 4 ranks
    assert hicache_limit(cap.GIB, 100 * cap.GIB, 1) == 0


def test_the_study_far_ends() -> None:
    data = demo(tp=2)
    data["space"]["hicache-size"] = {"low": 0, "high": 300}
    data["space"]["data-parallel-size"] = {"choices": [1, 4]}
    cfg = parse_study(data)
    assert largest_parallel(cfg) == Parallel(tp=2, dp=4)
    assert largest_parallel(cfg).ranks == 8  # DP without DP attention: replicas
    data["server"]["enable-dp-attention"] = True
    data["space"]["data-parallel-size"] = {"choices": [1, 2]}
    assert largest_parallel(parse_study(data)).ranks == 2  # the GPUs, not TP x DP
    assert values_of(cfg, "hicache-size") == ("space.hicache-size", [0.0, 300.0])
    assert model_path(cfg) == "meta-llama/Llama-3.1-8B-Instruct"
    flags = study_flags(cfg)
    assert flags["tp"] == "server.tp" and "concurrency" not in flags and "port" in flags


def test_version_probe_targets() -> None:
    assert python_module(["python3", "-m", "sglang.launch_server"]) == (
        ["python3"],
        "sglang.launch_server",
    )
    assert python_module(["env", "X=1", "py", "-m", "tuner.sim", "--sim-seed", "1"]) == (
        ["env", "X=1", "py"],
        "tuner.sim",
    )
    assert python_module(["sglang", "serve"]) is None and python_module(["-m", "x"]) is None
    assert version_package("sglang.launch_server") == "sglang"
    assert version_package("tuner.sim") == "tuner.sim"


def test_capacity_reading_uses_the_space_ends() -> None:
    data = demo()
    data["hardware"]["weights_gib"] = 15
    line = capacity(parse_study(data))
    assert line.status in (OK, "warn") and "131,072 B/token" in line.detail
    assert "mfs 0.8:" in line.detail and "mfs 0.98:" in line.detail


def test_a_fail_skips_what_depends_on_it() -> None:
    cfg = parse_study(demo())
    probe = Probe(cfg, Launch.of(cfg.target))
    checks = (
        Check("a", "first", lambda p: fail("first", "broken", SetupError)),
        Check("b", "second", lambda p: ok("second", "fine"), ("a",)),
        Check("c", "third", lambda p: ok("third", "fine"), ("b",)),
        Check("d", "fourth", lambda p: ok("fourth", "fine")),
    )
    lines = _run(checks, probe)
    assert [(x.status, x.name) for x in lines] == [
        (FAIL, "first"),
        (SKIP, "second"),
        (SKIP, "third"),
        (OK, "fourth"),
    ]
    assert lines[2].detail == "skipped: first FAILed"


def test_render_aligns_the_columns(tmp_path: Path) -> None:
    text = render([CheckLine(OK, "a", "x"), CheckLine(FAIL, "longer name", "y")])
    assert text == "ok    a            x\nFAIL  longer name  y\n"
