"""What a command writes never costs the study: `-o` refused over the study file, its database
or tuner's own files (one line, exit 2, nothing written); outputs written atomically; a full
disk is one line and exit 1; `tuner check --runs-dir` as strict as `tuner tune`; no folder
made for a SQLite URL the user wrote."""

from __future__ import annotations

import argparse
import errno
import sqlite3
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc

from tests.helpers.paths import REPO
from tests.helpers.studies import study_dict
from tuner import cli
from tuner.commands import check as check_cmd
from tuner.commands.common import guard_output, output_file
from tuner.config.load import parse_study
from tuner.errors import ConfigError, InfraError
from tuner.report.export import write_atomic, write_text
from tuner.study.storage import check_url, make_storage, storage_url

STUDY = study_dict(
    study="unit",
    server={"model-path": "m", "tensor-parallel-size": 1},
    space={
        "mem-fraction-static": {"low": 0.80, "high": 0.96, "step": 0.02},
        "concurrency": {"choices": [16, 32]},
    },
    objective__slo={"p99_ttft_ms": 5000},
)


def study_in(tmp_path: Path, **over: object):
    source = tmp_path / "unit.yaml"
    source.write_text("study: unit\n")  # its contents are not read here: its path is
    return parse_study({**STUDY, **over}, str(source)), source


def args_for(source: Path, runs: Path, output: Path | None, storage: str | None = None):
    return argparse.Namespace(output=output, study_file=str(source), runs_dir=runs, storage=storage)


# 1. -o never over the study ------------------------------------------------------------------


def test_output_over_the_study_file_is_refused(tmp_path: Path) -> None:
    cfg, source = study_in(tmp_path)
    with pytest.raises(ConfigError, match=r"^-o: .*unit.yaml is the study file itself"):
        guard_output(args_for(source, tmp_path / "runs", source), cfg, own="best.yaml")
    # the same file by another name (a symlink) is the same file
    link = tmp_path / "link.yaml"
    link.symlink_to(source)
    with pytest.raises(ConfigError, match="study file itself"):
        guard_output(args_for(source, tmp_path / "runs", link), cfg, own="best.yaml")


def test_output_over_the_default_database_is_refused_even_before_it_exists(
    tmp_path: Path,
) -> None:
    cfg, source = study_in(tmp_path)
    runs = tmp_path / "runs"
    for name in ("study.db", "study.db-journal", "study.db-wal"):
        with pytest.raises(ConfigError, match=r"^-o: .* is the study's database"):
            guard_output(args_for(source, runs, runs / "unit" / name), cfg, own="best.yaml")


@pytest.mark.parametrize("where", ["file", "flag"])
def test_output_over_a_custom_sqlite_storage_is_refused(tmp_path: Path, where: str) -> None:
    db = tmp_path / "elsewhere" / "night.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    if where == "file":
        cfg, source = study_in(tmp_path, storage=url)
        args = args_for(source, tmp_path / "runs", db)
    else:
        cfg, source = study_in(tmp_path)
        args = args_for(source, tmp_path / "runs", db, storage=url)
    with pytest.raises(ConfigError, match="the study's database"):
        guard_output(args, cfg, own="report.html")


@pytest.mark.parametrize(
    ("inside", "own"),
    [
        ("trials/3/metrics.json", "best.yaml"),
        ("trials/new.txt", "best.yaml"),
        ("locks/w.lock", "report.html"),
        ("report.html", "best.yaml"),
        ("best.yaml", "report.html"),
    ],
)
def test_output_over_tuner_s_own_files_is_refused(tmp_path: Path, inside: str, own: str) -> None:
    cfg, source = study_in(tmp_path)
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"^-o: .*tuner's own"):
        guard_output(args_for(source, runs, runs / "unit" / inside), cfg, own=own)


@pytest.mark.parametrize(
    ("where", "own"),
    [
        ("runs/unit/best.yaml", "best.yaml"),  # export over the night's own best.yaml: its job
        ("runs/unit/report.html", "report.html"),
        ("runs/unit/winner.json", "best.yaml"),  # a file of the user's beside tuner's
        ("runs/other/study.db", "best.yaml"),  # not this study's (output_file judges contents)
        ("out/best.yaml", "best.yaml"),
        ("unit.yml", "best.yaml"),
    ],
)
def test_legitimate_outputs_pass(tmp_path: Path, where: str, own: str) -> None:
    cfg, source = study_in(tmp_path)
    guard_output(args_for(source, tmp_path / "runs", tmp_path / where), cfg, own=own)
    guard_output(args_for(source, tmp_path / "runs", None), cfg, own=own)  # stdout


def test_output_file_refuses_any_existing_sqlite_database(tmp_path: Path) -> None:
    db = tmp_path / "anything.txt"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(argparse.ArgumentTypeError, match="is a SQLite database"):
        output_file(str(db))
    previous = tmp_path / "previous.yaml"
    previous.write_text("old export\n")
    assert output_file(str(previous)) == previous  # overwriting an earlier export is fine
    assert output_file(str(tmp_path / "new.csv")) == tmp_path / "new.csv"


def test_export_refusal_is_one_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    study = tmp_path / "s.yaml"
    study.write_text((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    before = study.read_bytes()
    code = cli.main(["export", str(study), "--runs-dir", str(tmp_path / "runs"), "-o", str(study)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "-o" in err and "study file itself" in err
    assert study.read_bytes() == before


def test_a_symlink_loop_where_the_study_lives_is_one_line(tmp_path: Path, capsys) -> None:
    """Path.resolve raises on a loop (runs/<study> linked to itself): `export -o` says so in one
    line, exit 2, and writes nothing."""
    study = tmp_path / "s.yaml"
    study.write_text((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    (tmp_path / "runs").mkdir()
    loop = tmp_path / "runs" / "demo-sim"
    loop.symlink_to(loop)
    out = tmp_path / "best.yaml"
    code = cli.main(["export", str(study), "--runs-dir", str(tmp_path / "runs"), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "-o" in err and "cannot follow" in err
    assert "Traceback" not in err and not out.exists()


# 2. and 3. writes: atomic, and a failure is one line ------------------------------------------


def test_a_failed_write_keeps_the_previous_file_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "best.yaml"
    path.write_text("previous winner\n")

    def half_then_full(to: Path) -> None:
        to.write_text("new win")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(InfraError, match=r"cannot write .*best.yaml: No space left on device"):
        write_atomic(path, half_then_full)
    assert path.read_text() == "previous winner\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]


def test_write_best_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.report.export as export

    (tmp_path / "best.yaml").write_text("previous winner\n")
    monkeypatch.setattr(export, "export_data", lambda cfg, study: {})
    monkeypatch.setattr(export, "render_yaml", lambda data: "new winner\n" * 1000)

    def no_room(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export.os, "fsync", no_room)  # the disk fills before the rename
    with pytest.raises(InfraError):
        export.write_best(None, None, tmp_path)  # type: ignore[arg-type]
    assert (tmp_path / "best.yaml").read_text() == "previous winner\n"
    monkeypatch.undo()
    monkeypatch.setattr(export, "export_data", lambda cfg, study: {})
    monkeypatch.setattr(export, "render_yaml", lambda data: "new winner\n")
    assert export.write_best(None, None, tmp_path)[0].read_text() == "new winner\n"  # type: ignore[arg-type]


def test_write_keeps_mode_and_symlink_and_writes_devices_in_place(tmp_path: Path) -> None:
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640
    with pytest.raises(InfraError, match=r"^cannot write /dev/full: No space left on device$"):
        write_text(Path("/dev/full"), "x" * 100_000)
    assert Path("/dev/full").is_char_device()


# 4. the world stops the study: one line, exit 1 -----------------------------------------------


def _optuna_style_failure() -> None:
    """What optuna raises when a trial's result cannot be committed: its StorageInternalError
    (from SQLAlchemy's OperationalError), then its own "Should not reach" assertion."""
    try:
        try:
            try:
                raise sqlite3.OperationalError("database or disk is full")
            except sqlite3.OperationalError as e:
                raise sqlalchemy.exc.OperationalError("INSERT ...", {}, e) from e
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit."
            ) from e
    except optuna.exceptions.StorageInternalError:
        code = compile("assert False, 'Should not reach.'", "/x/optuna/study/_optimize.py", "exec")
        exec(code)


def raising(exc: BaseException):
    def raiser() -> None:
        raise exc

    return raiser


def _fail_with(monkeypatch: pytest.MonkeyPatch, raiser) -> None:
    def run(args: argparse.Namespace) -> int:
        raiser()
        return 0

    monkeypatch.setattr(check_cmd, "run", run)


@pytest.mark.parametrize(
    "raiser",
    [
        _optuna_style_failure,
        raising(OSError(errno.ENOSPC, "No space left on device", "/r/x.log")),
    ],
)
def test_disk_full_is_one_line_exit_1(monkeypatch, capsys, tmp_path: Path, raiser) -> None:
    _fail_with(monkeypatch, raiser)
    code = cli.main(["check", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("tuner: failed: cannot write ") and err.count("\n") == 1
    assert "database or disk is full" in err or "/r/x.log: No space left on device" in err


def test_disk_full_names_the_study_database(monkeypatch, capsys, tmp_path: Path) -> None:
    source = tmp_path / "s.yaml"
    source.write_text((REPO / "search_spaces" / "demo-sim.yaml").read_text())
    _fail_with(monkeypatch, _optuna_style_failure)
    assert cli.main(["check", str(source), "--runs-dir", str(tmp_path / "runs")]) == 1
    db = tmp_path / "runs" / "demo-sim" / "study.db"
    assert (
        capsys.readouterr().err == f"tuner: failed: cannot write {db}: database or disk is full\n"
    )


@pytest.mark.parametrize(
    "bug",
    [
        raising(ValueError("a bug")),
        raising(OSError(errno.EACCES, "Permission denied")),
    ],
)
def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path: Path, bug) -> None:
    _fail_with(monkeypatch, bug)
    with pytest.raises((ValueError, OSError)):
        cli.main(["check", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path)])


def test_tuner_s_own_assertion_over_a_storage_error_keeps_its_traceback(
    monkeypatch, tmp_path: Path
) -> None:
    def raiser() -> None:
        try:
            raise optuna.exceptions.StorageInternalError("commit failed")
        except optuna.exceptions.StorageInternalError:
            raise AssertionError("tuner's own invariant") from None

    _fail_with(monkeypatch, raiser)
    with pytest.raises(AssertionError):
        cli.main(["check", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path)])


# 5. tuner check --runs-dir as tune takes it ---------------------------------------------------


@pytest.mark.parametrize("runs", ["afile", "afile/deep/x", ""])
def test_check_refuses_a_runs_dir_tune_refuses(tmp_path: Path, capsys, runs: str) -> None:
    (tmp_path / "afile").write_text("not a folder\n")
    value = str(tmp_path / runs) if runs else runs
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["check", "s.yaml", "--runs-dir", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runs-dir" in err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["tune", "s.yaml", "--runs-dir", value])


# 6. no folder made for a SQLite URL the user wrote ---------------------------------------------


def test_a_missing_folder_in_the_study_file_s_storage_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/nodir/study.db"
    cfg, _ = study_in(tmp_path, storage=url)
    with pytest.raises(ConfigError, match=r"unit.yaml: storage: .*nodir.* does not exist"):
        storage_url(cfg, tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"^--storage: .*nodir.* does not exist"):
        storage_url(study_in(tmp_path)[0], tmp_path / "runs", url)
    with pytest.raises(ConfigError, match=r"^--storage: "):
        make_storage(url, 2)  # a URL from anywhere else: never a folder made for it
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"^storage: .*is not a directory"):
        check_url(f"sqlite:///{tmp_path}/afile/study.db", key="storage")
    assert not (tmp_path / "nodir").exists()


def test_a_full_disk_on_opening_the_storage_is_the_world_s_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner.study.storage as study_mod

    def full(*args: object, **kw: object) -> None:
        orig = sqlite3.OperationalError("database or disk is full")
        raise sqlalchemy.exc.OperationalError("CREATE TABLE ...", {}, orig)

    monkeypatch.setattr(study_mod, "RDBStorage", full)
    url = f"sqlite:///{tmp_path}/mine.db"
    with pytest.raises(InfraError, match=r"^cannot write .*mine.db: database or disk is full$"):
        make_storage(url, 2)


def test_another_storage_failure_is_one_line_too(monkeypatch, capsys, tmp_path: Path) -> None:
    def locked() -> None:
        orig = sqlite3.OperationalError("database is locked")
        raise sqlalchemy.exc.OperationalError("UPDATE ...", {}, orig)

    _fail_with(monkeypatch, locked)
    assert cli.main(["check", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "tuner: failed: the study's database failed: database is locked\n"


def test_the_default_database_s_folder_is_still_created(tmp_path: Path) -> None:
    cfg, _ = study_in(tmp_path)
    url = storage_url(cfg, tmp_path / "deep" / "runs")
    make_storage(url, 2)
    assert (tmp_path / "deep" / "runs" / "unit" / "study.db").is_file()


def test_a_user_s_url_in_an_existing_folder_still_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/mine.db"
    cfg, _ = study_in(tmp_path, storage=url)
    assert storage_url(cfg, tmp_path / "runs") == url
    make_storage(url, 2)
    assert (tmp_path / "mine.db").is_file()


def test_a_default_folder_that_cannot_be_made_names_runs_dir(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    cfg, _ = study_in(tmp_path)
    with pytest.raises(ConfigError, match=r"^--runs-dir: "):
        storage_url(cfg, tmp_path / "afile" / "runs")


def test_the_notification_of_a_full_disk_says_so_not_optunas_assertion() -> None:
    from tuner.report.summary import message_of

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/s/study.db")
        except OSError:
            raise AssertionError("Should not reach.")  # noqa: B904 (as optuna's code does)
    except AssertionError as exc:
        caught = exc
    caught.__traceback__ = None  # not raised in optuna: only the disk in its chain counts
    assert message_of(caught) == "Should not reach."  # a bug in tuner keeps its own words
    full = OSError(errno.ENOSPC, "No space left on device", "/runs/s/study.db")
    assert message_of(full) == "cannot write /runs/s/study.db: No space left on device"


def test_a_full_disk_under_an_open_file_names_the_runs_folder(
    monkeypatch, capsys, tmp_path: Path
) -> None:
    """A write to a file already open fails with no file name (OSError.filename None): the
    line names the runs folder it was under instead of nothing."""
    _fail_with(monkeypatch, raising(OSError(errno.ENOSPC, "No space left on device")))
    code = cli.main(["check", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert err == f"tuner: failed: cannot write under {tmp_path}: No space left on device\n"
