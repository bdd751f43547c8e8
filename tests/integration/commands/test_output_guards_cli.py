"""The study survives what the commands write, through the real entry point (subprocesses,
`tune --virtual`): `-o` over the study's database or file refused (exit 2, one line, nothing
written); a write to a full device one line, exit 1; a study on a disk that fills up one line,
exit 1, and resumable; `check --runs-dir` and a user's SQLite URL refused as `tune` does."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.studies import REPO, tuner

#: one xdist worker for the module (pyproject's `--dist loadgroup`): `finished` runs a virtual
#: study (~10 s) once per worker that runs any of these tests
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("output-guards")]

DEMO = REPO / "search_spaces" / "demo-sim.yaml"


def one_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished virtual study in runs/demo-sim/ beside its study file, demo.yaml."""
    home = tmp_path_factory.mktemp("night")
    shutil.copy(DEMO, home / "demo.yaml")
    r = tuner("tune", "demo.yaml", "--runs-dir", "runs", "--virtual", "--no-progress", cwd=home)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (home / "runs" / "demo-sim" / "study.db").is_file()
    return home


@pytest.fixture
def night(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished study of its own: a test that loses it loses only its copy."""
    return Path(shutil.copytree(finished, tmp_path / "night"))


@pytest.mark.parametrize("command", ["export", "report"])
@pytest.mark.parametrize("target", ["runs/demo-sim/study.db", "demo.yaml"])
def test_output_over_the_study_is_refused(night: Path, command: str, target: str) -> None:
    before = (night / target).read_bytes()
    r = tuner(command, "demo.yaml", "--runs-dir", "runs", "-o", target, cwd=night)
    assert r.returncode == 2
    assert "-o" in one_line(r) and target.rsplit("/", 1)[-1] in r.stderr
    assert (night / target).read_bytes() == before


def test_the_usual_outputs_still_work(night: Path) -> None:
    r = tuner(
        "export", "demo.yaml", "--runs-dir", "runs", "-o", "runs/demo-sim/best.yaml", cwd=night
    )
    assert r.returncode == 0, r.stderr
    assert "mem-fraction-static" in (night / "runs/demo-sim/best.yaml").read_text()
    for _ in range(2):  # a new file, then over the previous export
        r = tuner("export", "demo.yaml", "--runs-dir", "runs", "-o", "winner.yaml", cwd=night)
        assert r.returncode == 0, r.stderr
    r = tuner("report", "demo.yaml", "--runs-dir", "runs", cwd=night)
    assert r.returncode == 0, r.stderr
    r = tuner(
        "report", "demo.yaml", "--runs-dir", "runs", "-o", "runs/demo-sim/report.html", cwd=night
    )
    assert r.returncode == 0, r.stderr
    assert not list((night / "runs" / "demo-sim").glob(".*.tmp"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("command", ["export", "report"])
def test_a_full_device_is_one_line_exit_1(night: Path, command: str) -> None:
    r = tuner(command, "demo.yaml", "--runs-dir", "runs", "-o", "/dev/full", cwd=night)
    assert r.returncode == 1
    assert one_line(r) == "tuner: failed: cannot write /dev/full: No space left on device\n"
    assert Path("/dev/full").is_char_device()


def test_check_refuses_a_runs_dir_that_is_a_file(night: Path) -> None:
    (night / "afile").write_text("not a folder\n")
    r = tuner("check", "demo.yaml", "--runs-dir", "afile", cwd=night)
    assert r.returncode == 2
    assert "--runs-dir" in one_line(r) and "afile is not a directory" in r.stderr


@pytest.mark.parametrize("where", ["--storage", "storage"])
def test_a_user_s_sqlite_url_in_a_missing_folder_is_refused(tmp_path: Path, where: str) -> None:
    url = f"sqlite:///{tmp_path}/nodir/study.db"
    text = DEMO.read_text()
    if where == "storage":
        text += f"\nstorage: {url}\n"
    (tmp_path / "demo.yaml").write_text(text)
    extra = ["--storage", url] if where == "--storage" else []
    r = tuner("tune", "demo.yaml", "--runs-dir", "runs", "--virtual", *extra, cwd=tmp_path)
    assert r.returncode == 2
    assert f"{where}: " in one_line(r) and "nodir" in r.stderr
    assert not (tmp_path / "nodir").exists() and not (tmp_path / "runs").exists()


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_disk_that_fills_up_is_one_line_and_the_study_resumes(tmp_path: Path) -> None:
    shutil.copy(DEMO, tmp_path / "demo.yaml")
    with small_disk(tmp_path / "disk", "32m") as disk:
        # another tenant's file leaves the study 2 MB: its whole run writes ~7 MB, and that
        # shrinks whenever its trials get shorter, so the room is set here, not by the size
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (30 << 20))
        args = ["tune", "demo.yaml", "--runs-dir", str(disk), "--virtual", "--no-progress"]
        r = tuner(*args, cwd=tmp_path)
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.returncode == 1
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("tuner: failed: cannot write "), last
        assert "run the same command again to resume" in last
        ballast.unlink()  # room again: the same command resumes
        r = tuner(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (disk / "demo-sim" / "best.yaml").is_file()
