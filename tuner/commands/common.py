"""Arguments and loading shared by the commands that work on a study file.

Paths the user names are checked when the arguments are parsed (argparse `type=`), so a bad
one is one line and exit 2 before the study file is read or anything is written.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tuner.config.load import load_study
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError

#: the first bytes of every SQLite database (tuner.study.storage.SQLITE_MAGIC; optuna stays unimported)
SQLITE_MAGIC = b"SQLite format 3\x00"
#: what tuner keeps in runs/<study>/ (folders, files): never a command's `-o`, except the
#: command's own output there (export: best.yaml, report: report.html)
OWN_FOLDERS, OWN_FILES = ("trials", "locks"), ("study.db", "best.yaml", "report.html")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def existing_or_creatable_dir(value: str) -> Path:
    """A directory that exists, or can be created (its nearest existing parent is a dir)."""
    if not value.strip():  # Path("") is ".": the study would land in the working directory
        raise argparse.ArgumentTypeError("expected a directory, got an empty name")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is not a directory")
    if not _nearest_existing(path.absolute()).is_dir():
        raise argparse.ArgumentTypeError(f"{value}: a parent of it is not a directory")
    return path


def writable_dir(value: str) -> Path:
    """As `existing_or_creatable_dir`, and writable (the run creates files under it)."""
    path = existing_or_creatable_dir(value)
    base = _nearest_existing(path.absolute())
    if not os.access(base, os.W_OK | os.X_OK):
        what = "is" if base == path.absolute() else f"cannot be created: {base} is"
        raise argparse.ArgumentTypeError(f"{value} {what} not writable")
    return path


def output_file(value: str) -> Path:
    """A file to write: not a directory, in an existing writable directory."""
    path = Path(value)
    if not value or path.is_dir() or value.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{value!r} is a directory, expected a file name")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {path.parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {path.parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{value} is not writable")
    if _is_sqlite(path):
        raise argparse.ArgumentTypeError(
            f"{value} is a SQLite database (a study?): tuner never writes over one, "
            "give another file name"
        )
    return path


def _is_sqlite(path: Path) -> bool:
    try:
        if not path.is_file():  # a FIFO would block, a device is no database
            return False
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def guard_output(args: argparse.Namespace, cfg: StudyConfig, *, own: str) -> None:
    """Refuse an `-o` that would write over the study itself, before anything is read or
    written: the study file, its SQLite database (and journals), or a file tuner keeps in
    runs/<study>/, except `own`, the file this command itself writes there."""
    if args.output is None:
        return
    try:
        _guard_output(args, cfg, own)
    except (RuntimeError, OSError) as exc:  # Path.resolve on a symlink loop: RuntimeError
        raise ConfigError(
            f"cannot follow {args.output} or the study's folder ({exc}): fix the link or give "
            "another file name",
            key="-o",
        ) from None


def _guard_output(args: argparse.Namespace, cfg: StudyConfig, own: str) -> None:
    from tuner.study.storage import storage_url, study_dir

    out = args.output.resolve()

    def refuse(what: str) -> ConfigError:
        return ConfigError(f"{args.output} is {what}: give another file name", key="-o")

    if _same(out, Path(args.study_file)):
        raise refuse("the study file itself")
    db = _sqlite_path(storage_url(cfg, args.runs_dir, args.storage))
    if db is not None and any(
        _same(out, db.with_name(db.name + end)) for end in ("", "-journal", "-wal", "-shm")
    ):
        raise refuse(f"the study's database ({db}), writing there would lose the study")
    folder = study_dir(cfg, args.runs_dir).resolve()
    if not out.is_relative_to(folder) or out == folder:
        return
    inside = out.relative_to(folder).parts
    name = inside[0]
    if name in OWN_FOLDERS:
        raise refuse(f"in tuner's own {name}/ folder of study '{cfg.study}'")
    if len(inside) == 1 and name in OWN_FILES and name != own:
        raise refuse(f"tuner's own {name} of study '{cfg.study}'")


def _same(a: Path, b: Path) -> bool:
    """The same file: one path (symlinks resolved) or one inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _sqlite_path(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database).absolute()


def add_study_args(p: argparse.ArgumentParser, *, writes: bool = False) -> None:
    """STUDY.yaml, --runs-dir and --storage; `writes`: the command creates files in the runs dir."""
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study file")
    p.add_argument(
        "--runs-dir",
        default="runs",
        type=writable_dir if writes else existing_or_creatable_dir,
        help="outputs, one folder per study (default ./runs)",
    )
    p.add_argument(
        "--storage",
        type=_storage_url,
        help="optuna storage URL (default: sqlite runs/<study>/study.db)",
    )


def _storage_url(value: str) -> str:
    # an empty URL would silently fall back to the default storage (a different study)
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a database URL, got an empty one")
    return value


def load(args: argparse.Namespace) -> StudyConfig:
    """The study file, validated; optuna's own INFO chatter silenced (our lines say more)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return load_study(args.study_file)
