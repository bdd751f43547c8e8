"""`tuner tune` watched from outside: piped, it prints plain lines (a timestamp each, a unit on
every number, no trailing spaces) with the phases and the server's own start-up milestones;
`--notify CMD` gets the run's summary on stdin, when it finishes and when it fails, and a
notify command that fails never changes the study's exit code. Real simulator, real files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.studies import study_file, tuner

pytestmark = pytest.mark.slow

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d (\S.*)$")
#: a number not inside a name (p99, TP0) nor a trial's number (#3) or a value (mfs=0.85)
NUMBER = re.compile(r"(?<![\w.#=/,])\d[\d,]*(?:\.\d+)?(?![\w.,/])")


def numbers_without_units(text: str) -> list[str]:
    """Numbers not followed by a space and a word (a unit, or what is counted)."""
    text = re.sub(r"\S+=\S+", "", text)  # searched params: mem-fraction-static=0.85
    text = re.sub(r"\d+/\d+ (trials|run)", "", text)  # trial 2/10, run 1/1
    return [
        m.group(0) for m in NUMBER.finditer(text) if not re.match(r" [A-Za-z(]", text[m.end() :])
    ]


def test_piped_tune_prints_plain_lines_and_notifies(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = study_file(tmp_path, name="watched", n_trials=2, budget__confirm_top=0)
    summary = tmp_path / "summary.json"
    out = tuner(
        "tune", str(study), "--runs-dir", str(runs), "--notify", f"cat > {summary}", timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    for line in lines:
        m = STAMP.match(line)
        assert m, f"no timestamp: {line!r}"
        assert line == line.rstrip(), f"trailing space: {line!r}"
        # our own lines carry a unit on every number (a failed start's line quotes SGLang)
        if "start_failed" not in line:
            assert numbers_without_units(m.group(1)) == [], line
    text = "\n".join(STAMP.match(x).group(1) for x in lines)  # type: ignore[union-attr]
    assert text.startswith("study watched: 0/2 trials complete, time budget")
    for expected in (
        r"trial #0 started \(1/2 trials\): mem-fraction-static=0.98 concurrency=16",
        r"trial #0 phase stopping",
        r"trial #0 phase starting \(stopping took [\d.]+ s\)",
        r"trial #0 server: KV cache allocated: [\d,]+ tokens",  # SGLang's own log, as it came
        r"trial #0 start_failed .*Capture cuda graph",
        r"trial #1 phase load run \(warm-up took [\d.]+ s\)",
        r"trial #1 server: ready to roll",
        r"progress 2/2 trials: 2 complete: \d feasible, \d infeasible \(1 oom_cuda_graph\)",
        r"best launch config written to ",
    ):
        assert re.search(expected, text), f"missing {expected!r} in:\n{text}"
    sent = json.loads(summary.read_text())
    assert (sent["event"], sent["exit_code"], sent["study"]) == ("finished", 0, "watched")
    assert sent["trials"]["complete"] == 2 and sent["best_yaml"].endswith("best.yaml")
    assert sent["best"]["params"]["mem-fraction-static"] < 0.98
    assert 1 <= sent["best"]["held"] <= len(sent["best"]["runs"])  # the first run held alone
    hours = sent["gpu_hours"]  # 1 GPU, seconds of wall: start-ups and a 2.5 s window
    assert 0 < hours["search"] < 0.02 and hours["confirmation"] == 0 and hours["first_within"]


def test_a_failed_run_notifies_and_a_failing_notifier_changes_nothing(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = study_file(tmp_path, name="broken", n_trials=2)
    data = yaml.safe_load(study.read_text())
    # a flag SGLang's parser refuses, passed as given: the first start shows it, exit 2
    data["server"]["enable-turbo-mode"] = True
    data["target"]["unchecked_flags"] = ["enable-turbo-mode"]
    summary = tmp_path / "summary.json"
    data["notify"] = {"command": f"cat > {summary}; echo webhook down >&2; exit 3"}
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tuner("tune", str(study), "--runs-dir", str(runs), timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "enable-turbo-mode" in out.stderr and "Traceback" not in out.stderr
    assert "notify command failed (it exited with status 3: webhook down)" in out.stderr
    sent = json.loads(summary.read_text())
    assert (sent["event"], sent["exit_code"]) == ("failed", 2)
    assert "enable-turbo-mode" in sent["message"] and sent["best"] is None
