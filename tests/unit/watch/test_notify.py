"""`--notify CMD` / `notify:`: a real command gets the JSON summary on stdin; its failure or
hang is one line, never the study's; the summary carries no secret."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.schema import NotifySection
from tuner.errors import ConfigError, HaltError
from tuner.report.summary import event_of, exit_code_of, run_summary
from tuner.watch.notify import notify_for, send


def pid_alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


STUDY = study_dict(
    target={"env": {"HF_TOKEN": "hf_abcdefgh12345"}, "api_key_env": "TUNER_TEST_KEY"}
)


def test_the_command_gets_the_summary_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    cmd = f'cat > {out}; echo "$TUNER_EVENT $TUNER_STUDY" > {out}.env'
    assert send(NotifySection(command=cmd), {"event": "finished", "study": "s", "n": 1}) is None
    assert json.loads(out.read_text()) == {"event": "finished", "study": "s", "n": 1}
    assert Path(f"{out}.env").read_text() == "finished s\n"


def test_a_failing_or_hanging_command_is_a_reason_not_an_error(tmp_path: Path) -> None:
    why = send(NotifySection(command="echo 'no route to host' >&2; exit 7"), {})
    assert why == "it exited with status 7: no route to host"
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    why = send(NotifySection(command=f"sleep 30 & echo $! > {pidfile}; wait", timeout_s=1), {})
    assert why == "it ran past its 1 s deadline and was killed"
    assert time.monotonic() - t0 < 15
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:  # its whole group went
        time.sleep(0.05)
    assert not pid_alive(child)


def test_the_flag_wins_over_the_file_and_the_file_is_checked() -> None:
    cfg = parse_study({**STUDY, "notify": {"command": "cat > /dev/null", "timeout_s": 5}})
    assert notify_for(None, cfg.notify) == cfg.notify
    assert notify_for("true", cfg.notify) == NotifySection(command="true", timeout_s=5)
    assert notify_for(None, None) is None
    with pytest.raises(ConfigError, match=r"x\.yaml: notify\.command: expected a shell command"):
        parse_study({**STUDY, "notify": {"command": " "}}, source="x.yaml")
    with pytest.raises(ConfigError, match=r"notify\.timeout_s"):
        parse_study({**STUDY, "notify": {"command": "true", "timeout_s": 0}}, source="x.yaml")


def test_the_summary_names_the_event_and_masks_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_TEST_KEY", "sk-live-0123456789")
    cfg = parse_study(STUDY, source="s.yaml")
    exc = HaltError("host said sk-live-0123456789 and hf_abcdefgh12345")
    summary = run_summary(
        cfg,
        exc=exc,
        exit_code=exit_code_of(exc),
        message=str(exc),
        started=time.time() - 5,
        ended=time.time(),
    )
    text = json.dumps(summary)
    assert "sk-live" not in text and "hf_abcdefgh" not in text and "***" in text
    assert (summary["event"], summary["exit_code"], summary["study"]) == ("stopped", 1, "s")
    assert 4 < summary["elapsed_s"] < 10 and summary["trials"] is None
    assert event_of(KeyboardInterrupt(), 130) == "interrupted"
    assert exit_code_of(ConfigError("x")) == 2 and event_of(ConfigError("x"), 2) == "failed"
    assert os.environ["TUNER_TEST_KEY"] == "sk-live-0123456789"
