"""The one line for a study the world stopped writing (a full disk, the study's database
failing), as the CLI prints it and the run's notification carries it; None for anything else,
so a bug keeps its traceback."""

from __future__ import annotations

import argparse
import errno
import sys

#: a full disk, as OSError says it (ENOSPC) and as a quota does (EDQUOT)
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def storage_failure(exc: BaseException, args: argparse.Namespace | None) -> str | None:
    """The one line for a study the world stopped writing: a full disk (OSError ENOSPC), the
    study's database failing (optuna's StorageInternalError, SQLAlchemy's OperationalError),
    also when optuna's own bookkeeping then trips over it (an AssertionError raised inside
    optuna while that failure is being handled). None for anything else: a bug keeps its
    traceback. The study stays as the database has it: rerunning resumes it."""
    chain, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    kinds = _storage_errors()
    if not isinstance(exc, (OSError, *kinds)) and not _optuna_assertion(exc):
        return None
    for e in chain:
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            # a write to a file already open carries no name: the runs folder it is under
            where = f" {e.filename}" if e.filename else _under_runs(args)
            return f"cannot write{where}: {e.strerror}{_resume(args, 'make room')}"
    failed = [e for e in chain if isinstance(e, kinds)]
    if not failed:
        return None
    # SQLAlchemy's error keeps the database's own words (`orig`); optuna's wraps it
    e = next((e for e in failed if getattr(e, "orig", None) is not None), failed[0])
    orig = getattr(e, "orig", None) or e
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    reason = lines[0] if lines else type(orig).__name__
    db = _database(args)
    if "full" in reason:  # SQLite's "database or disk is full"
        where = db or "the study's database"
        return f"cannot write {where}: {reason}{_resume(args, 'make room')}"
    where = f" {db}" if db else ""
    return f"the study's database{where} failed: {reason}{_resume(args, 'fix it')}"


def _storage_errors() -> tuple[type[BaseException], ...]:
    """The storage's exception types, from the modules already imported (none imported here)."""
    kinds: list[type[BaseException]] = []
    if (optuna_exc := sys.modules.get("optuna.exceptions")) is not None:
        kinds.append(optuna_exc.StorageInternalError)
    if (sa_exc := sys.modules.get("sqlalchemy.exc")) is not None:
        kinds.append(sa_exc.OperationalError)
    return tuple(kinds)


def _optuna_assertion(exc: BaseException) -> bool:
    """An AssertionError raised in optuna's own code (its trial bookkeeping's "Should not
    reach" after a failed write), not in tuner's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (
        isinstance(exc, AssertionError)
        and tb is not None
        and "/optuna/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
    )


def _database(args: argparse.Namespace | None) -> str | None:
    """The study's database as the user knows it (a SQLite file's path, a masked URL)."""
    try:
        from tuner.config.load import load_study
        from tuner.study.storage import masked, storage_url

        cfg = load_study(args.study_file)  # type: ignore[union-attr]
        url = storage_url(cfg, args.runs_dir, getattr(args, "storage", None))  # type: ignore[union-attr]
    except Exception:  # no study at hand, or it cannot be read again
        return None
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else masked(url)


def _under_runs(args: argparse.Namespace | None) -> str:
    """' under <runs folder>' for a command that writes there, else ''."""
    runs = getattr(args, "runs_dir", None)
    return f" under {runs}" if runs else ""


def _resume(args: argparse.Namespace | None, first: str) -> str:
    """How a stopped study goes on (`tune` only: the other commands simply run again)."""
    if getattr(args, "command", None) != "tune":
        return ""
    return f" ({first}, then run the same command again to resume)"
