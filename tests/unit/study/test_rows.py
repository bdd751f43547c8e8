"""A study.db edited by hand (study/rows.py): every command that opens the study says which row
holds what, in one line, exit 2, and writes nothing; an untouched study opens as before.

The study is a real one: `tuner tune --virtual` on the demo (a few trials, a confirmation), its
SQLite file then edited with SQLite itself, as a user with `sqlite3` would.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from tuner import cli
from tuner.study.rows import locate

STUDY = "rows"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the study file and the study's runs, made once for the module."""
    root = tmp_path_factory.mktemp("rows")
    data = yaml.safe_load((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    data["study"] = STUDY
    (root / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    args = ["tune", str(root / "s.yaml"), "--runs-dir", str(root / "runs"), "--virtual"]
    assert cli.main([*args, "--n-trials", "3", "--no-progress"]) == 0
    return root


@pytest.fixture
def study(made: Path, tmp_path: Path) -> Path:
    """A fresh copy of the made study (its folder) to edit."""
    shutil.copytree(made, tmp_path / "s")
    return tmp_path / "s"


def db_of(root: Path) -> Path:
    return root / "runs" / STUDY / "study.db"


def edit(root: Path, sql: str) -> None:
    con = sqlite3.connect(db_of(root))
    with con:
        con.execute(sql)
    con.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(root: Path, command: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    args = [command, str(root / "s.yaml"), "--runs-dir", str(root / "runs")]
    if command == "tune":
        args += ["--virtual", "--n-trials", "5", "--no-progress"]
    code = cli.main(args)
    return code, capsys.readouterr().err


def first_trial_attr(key: str) -> str:
    """The WHERE clause of trial 0's user attribute `key`."""
    return f"key = '{key}' AND trial_id = (SELECT trial_id FROM trials WHERE number = 0)"


#: (the edit, what the line must say)
EDITS = {
    "attribute not JSON": (
        f"UPDATE trial_user_attributes SET value_json = '{{broken' WHERE {first_trial_attr('worker')}",
        ["trial 0's attribute 'worker' is not JSON", '"{broken"'],
    ),
    "value NULL": (
        "UPDATE trial_values SET value = NULL WHERE trial_id = "
        "(SELECT trial_id FROM trials WHERE number = 0)",
        ["trial 0's objective value is null, not a number"],
    ),
    "distribution not JSON": (
        "UPDATE trial_params SET distribution_json = 'nope' WHERE param_name = "
        "'mem-fraction-static' AND trial_id = (SELECT trial_id FROM trials WHERE number = 1)",
        ["trial 1's parameter's distribution 'mem-fraction-static' is not JSON"],
    ),
    "unknown state": (
        "UPDATE trials SET state = 'BOGUS' WHERE number = 2",
        ["trial 2's state 'BOGUS' is none of optuna's", "COMPLETE"],
    ),
    "constraints not JSON": (
        "UPDATE trial_system_attributes SET value_json = '[1,' WHERE key = 'constraints'",
        ["system attribute 'constraints' is not JSON"],
    ),
    "study attribute not JSON": (
        "UPDATE study_user_attributes SET value_json = '{x' WHERE key = 'tuner:fingerprint'",
        ["the study's attribute 'tuner:fingerprint' is not JSON"],
    ),
    "status of the wrong type": (
        f"UPDATE trial_user_attributes SET value_json = '[1, 2]' WHERE {first_trial_attr('status')}",
        ["trial 0's attribute 'status' must hold a string, not [1, 2]"],
    ),
    "a metric of the wrong type": (
        "UPDATE trial_user_attributes SET value_json = '\"fast\"' WHERE "
        + first_trial_attr("window_output_throughput"),
        ["'window_output_throughput' must hold a number"],
    ),
    "complete without a value": (
        "DELETE FROM trial_values WHERE trial_id = (SELECT trial_id FROM trials WHERE number = 1)",
        ["trial 1 is COMPLETE with no value; the study has one objective"],
    ),
    "constraints not numbers": (
        "UPDATE trial_system_attributes SET value_json = '[\"a\", 1]' WHERE key = 'constraints'",
        ["constraints must be numbers"],
    ),
    "confirmations of the wrong shape": (
        'UPDATE study_user_attributes SET value_json = \'{"0": "x"}\' '
        "WHERE key LIKE 'tuner:confirmations:%'",
        ["the study's attribute 'tuner:confirmations:", "an object of lists of numbers"],
    ),
}


@pytest.mark.parametrize("command", ["status", "export", "tune"])
@pytest.mark.parametrize("name", list(EDITS))
def test_an_edited_row_is_one_line_naming_it_and_nothing_is_written(
    study: Path, name: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sql, fragments = EDITS[name]
    edit(study, sql)
    before, best = digest(db_of(study)), digest(study / "runs" / STUDY / "best.yaml")
    code, err = run(study, command, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err[-1500:]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(db_of(study)) in lines[0]
    for fragment in [*fragments, "edited by hand?"]:
        assert fragment in lines[0], (fragment, lines[0])
    assert digest(db_of(study)) == before, "the study's file was written"
    assert digest(study / "runs" / STUDY / "best.yaml") == best


def test_the_study_as_tune_left_it_opens(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No false alarm: the rows tune writes (confirmations, tails, time spent) all pass."""
    code, err = run(study, "status", capsys)
    assert code == 0, err
    assert "edited by hand" not in err


def test_the_report_reads_no_edited_row(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(study, EDITS["unknown state"][0])
    code, err = run(study, "report", capsys)
    assert code == 2 and "trial 2's state 'BOGUS'" in err and "Traceback" not in err


def test_locate_names_nothing_in_a_sound_file_or_one_that_is_not_sqlite(
    study: Path, tmp_path: Path
) -> None:
    assert locate(db_of(study)) is None
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    assert locate(junk) is None
