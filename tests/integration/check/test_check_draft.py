"""`tuner check`'s draft model line on this machine: a speculative draft's path must exist on
the host (a hub id is downloaded at start; the model's own MTP head needs none)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.studies import study_file
from tuner.check.lines import FAIL, OK, SKIP
from tuner.check.plan import run_checks

KEYS = ("ssh", "shell", "workdir", "draft model")


def draft_line(tmp_path: Path, **server: object) -> tuple[str, str]:
    path = study_file(tmp_path, "check-draft")
    data = yaml.safe_load(path.read_text())
    data["server"].update(server)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    line = {x.name: x for x in run_checks(path, keys=KEYS)}["draft model"]
    return line.status, line.detail


def test_the_draft_model_path(tmp_path: Path) -> None:
    assert draft_line(tmp_path)[0] == SKIP  # no draft: nothing to look for
    missing = tmp_path / "no-such-draft"
    eagle = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": str(missing)}
    status, detail = draft_line(tmp_path, **eagle)
    assert status == FAIL and str(missing) in detail
    assert "server.speculative-draft-model-path" in detail
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    assert draft_line(tmp_path, **{**eagle, "speculative-draft-model-path": str(draft)})[0] == OK
    hub = {**eagle, "speculative-draft-model-path": "lmsys/sglang-EAGLE3-LLaMA3.1-8B"}
    assert draft_line(tmp_path, **hub)[0] == OK
