"""The optuna study object: storage (SQLite or any URL), sampler, create or resume, fingerprint.

Resuming is refused when the study file changed what makes trials comparable (the fingerprint:
space, server flags, workload, objective, target). What is done with the study lives elsewhere:
the loop in study/loop.py, the queries over its trials in verdict/winner.py.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from tuner.config.schema import StudyConfig
from tuner.config.yamlfile import special_file
from tuner.errors import ConfigError, InfraError, StudyMismatchError
from tuner.search.sampler import make_sampler
from tuner.search.space import fingerprint, hosted_target_hash
from tuner.study.rows import check_rows, sqlite_path
from tuner.study.states import FINGERPRINT_ATTR

HEARTBEAT_S = 30
GRACE_S = 120
#: a database server that does not answer within this fails the command (libpq waits forever)
CONNECT_TIMEOUT_S = 10
SQLITE_MAGIC = b"SQLite format 3\x00"
#: a table every optuna schema has, and a column of it: a SQLite file with tables but not
#: this one is not a study (optuna would add its tables beside the stranger's, then fail)
OPTUNA_TABLE, OPTUNA_COLUMN = "studies", "study_name"
_NOT_REPLACED = "tuner never replaces it: move it away to start afresh, or restore it"


def masked(url: str) -> str:
    """The URL with its password hidden (messages and logs never show it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # unparsable: mask what looks like user:password@
        return _mask_userinfo(url)


def _mask_userinfo(url: str) -> str:
    """Hide everything between `user:` and the LAST `@`: a password may hold `/`, `:` or `@`."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    before, slashes, auth = head.partition("//")
    if not slashes:
        before, auth = "", head
    if ":" not in auth:
        return url
    return f"{before}{slashes}{auth.split(':', 1)[0]}:***@{tail}"


class DefaultURL(str):
    """The URL `storage_url` made for runs/<study>/study.db: the one storage whose folder tuner
    creates (a folder missing from a URL the user wrote is a typo, never made silently)."""


def check_url(url: str, *, key: str, file: str | None = None) -> None:
    """Refuse a storage URL that cannot work: unparsable, an unknown dialect, a missing driver,
    an in-memory SQLite, or a SQLite file that is empty, damaged or cannot be created (a user's
    SQLite file must be in an existing folder; only the default one's folder is created)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    def bad(message: str) -> ConfigError:
        return ConfigError(message, file=file, key=key)

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise bad(
            f"cannot parse {masked(url)!r} as a database URL: expected e.g. "
            "sqlite:////abs/path/study.db or postgresql+psycopg2://user@host:5432/db"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise bad(
            f"unknown database kind in {masked(url)!r}: expected sqlite, postgresql or mysql"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise bad(f"{parsed.drivername} needs the {exc.name} package (pip install it)") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise bad("an in-memory SQLite database loses the study: give a file, sqlite:////path")
        path = Path(parsed.database).absolute()
        check_sqlite_file(path, key=key, file=file, create_dirs=isinstance(url, DefaultURL))


def check_sqlite_file(
    path: Path, *, key: str, file: str | None = None, create_dirs: bool = True
) -> None:
    """An existing file must be a SQLite database (never treated as new: a 0-byte file is a
    lost study, not a fresh one); a missing one must be creatable in a writable directory,
    which must exist unless `create_dirs` (the default runs/<study>/ only)."""

    def bad(message: str) -> ConfigError:
        return ConfigError(message, file=file, key=key)

    if path.exists():
        if path.is_dir():
            raise bad(f"{path} is a directory, not a study database")
        if problem := special_file(path):  # opening a FIFO would block forever
            raise bad(f"{path} is {problem.split(',')[0]}, not a study database")
        try:
            with path.open("rb") as f:
                head = f.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise bad(f"cannot read {path}: {exc.strerror}") from None
        if not head:
            raise bad(f"{path} is empty (0 bytes), not a study database; {_NOT_REPLACED}")
        if head != SQLITE_MAGIC:
            raise bad(f"{path} is not a SQLite database (damaged?); {_NOT_REPLACED}")
        if tables := _foreign_tables(path):
            raise bad(
                f"{path} is a SQLite database of something else (tables {', '.join(tables)}), "
                f"not an optuna study; {_NOT_REPLACED}"
            )
        return
    if not create_dirs and not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise bad(
            f"the folder of {path}, {path.parent}, {what}: tuner creates no folder for a "
            "database you name (create it, or fix the path)"
        )
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise bad(f"{existing} is not a directory (the study's folder goes under it)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise bad(f"cannot create {path.parent}: {existing} is not writable")


def _foreign_tables(path: Path) -> list[str]:
    """The first tables of a SQLite file that holds tables but not optuna's (none when it is
    optuna's, new, or unreadable: the storage then says why). Opened read-only: optuna would
    add its tables beside a stranger's."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            columns = {r[1] for r in db.execute(f"PRAGMA table_info({OPTUNA_TABLE})")}
    except sqlite3.Error:
        return []
    return [] if not names or OPTUNA_COLUMN in columns else sorted(names)[:3]


def storage_error(url: str, exc: Exception) -> ConfigError:
    """A database error on opening the storage, as one line naming `--storage`."""
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    reason = lines[0] if lines else type(orig).__name__
    from sqlalchemy.engine import make_url

    with_password = make_url(url).password
    if with_password:
        reason = reason.replace(str(with_password), "***")
    return ConfigError(f"cannot open {masked(url)}: {reason}", key="--storage")


def study_dir(cfg: StudyConfig, runs_dir: Path) -> Path:
    return runs_dir / cfg.study


#: what tuner keeps in runs/<study>/: folders, and files it writes at the end of a night
STUDY_FOLDERS, STUDY_FILES = ("trials", "locks"), ("best.yaml",)


def check_study_dir(out_dir: Path) -> None:
    """Refuse, before anything is written, a runs/<study>/ whose folders are files (or whose
    best.yaml is a folder): the night would fail at its first trial, or at its very end."""
    for name, want_dir in [*((n, True) for n in STUDY_FOLDERS), *((n, False) for n in STUDY_FILES)]:
        path = out_dir / name
        if path.exists() and path.is_dir() != want_dir:
            what, kind = ("a file", "folder") if want_dir else ("a folder", "file")
            raise ConfigError(
                f"{path} is {what} where tuner keeps its {name} {kind}: move it away",
                key="--runs-dir",
            )


def storage_url(cfg: StudyConfig, runs_dir: Path, override: str | None = None) -> str:
    """`--storage`, else the study file's `storage:`, else SQLite in runs/<study>/study.db.

    Checked before anything opens it (storage.py): a URL that cannot work, or a SQLite file
    that is empty or not a database, is a ConfigError naming where the URL came from.
    """
    url = override or cfg.storage
    if url:
        where = {"key": "--storage"} if override else {"file": cfg.source, "key": "storage"}
        check_url(url, **where)
        return url
    path = (study_dir(cfg, runs_dir) / "study.db").absolute()
    check_sqlite_file(path, key="--runs-dir")
    return DefaultURL(f"sqlite:///{path}")


def make_storage(url: str, infra_retries: int, *, outage_s: float | None = None) -> RDBStorage:
    """RDBStorage with a heartbeat, so a killed worker's trial becomes FAIL and is retried.

    A PostgreSQL or MySQL storage rides out a database that goes away mid-study (a restart, a
    failover) for `outage_s` seconds (study.rdb.DB_OUTAGE_S when None); a SQLite file
    does not go down.

    A storage that refuses the connection, or a file that turns out damaged, is a ConfigError
    naming `--storage` (the URL's password masked); nothing is created before the URL checks.
    Only the default runs/<study>/ folder (a `DefaultURL`) is created; a disk that is full is
    the world's failure (InfraError), not a bad URL.
    """
    check_url(url, key="--storage")
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 20}}
        if isinstance(url, DefaultURL):
            try:
                Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot create the study's folder: {exc}", key="--runs-dir"
                ) from None
    elif url.startswith("postgresql"):
        # an address nobody answers must not hang the command (libpq waits forever by default)
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    import sqlalchemy.exc
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random

    from tuner.study.rdb import DB_OUTAGE_S, Outage, ResilientRDBStorage

    # a database server restarts or fails over; a SQLite file does not go down
    resilient: dict[str, Any] = {}
    if url.startswith(("postgresql", "mysql")):
        resilient["outage"] = Outage(DB_OUTAGE_S if outage_s is None else outage_s)

    # workers started together on a fresh database race to create optuna's schema: the loser
    # sees "already exists" and simply tries again, finding the tables made
    schema_race = (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)

    @retry(
        retry=retry_if_exception_type(schema_race),
        stop=stop_after_attempt(5),
        wait=wait_random(0.2, 1.0),
        reraise=True,
    )
    def create() -> RDBStorage:
        with warnings.catch_warnings():
            # the heartbeat is "experimental" since optuna 2.8; it is the documented way to resume
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return (ResilientRDBStorage if resilient else RDBStorage)(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    max_retry=infra_retries
                ),
                **resilient,
            )

    try:
        storage = create()
    except RuntimeError as exc:
        # a database another optuna version made: optuna says which command to run
        if "compatible with the table schema" not in str(exc):
            raise
        raise ConfigError(f"cannot open {masked(url)}: {exc}", key="--storage") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        error = storage_error(url, exc.__cause__ or exc)
        if DISK_FULL in error.detail:
            raise InfraError(f"cannot write {_where(url)}: {DISK_FULL}") from None
        raise error from None
    if url.startswith("sqlite"):  # a fleet's workers write it from several processes
        from tuner.study.sqlitetx import immediate_transactions

        immediate_transactions(storage)
    return storage


#: SQLite's words for a write that found no room (SQLITE_FULL)
DISK_FULL = "database or disk is full"


def _where(url: str) -> str:
    """A storage URL as a message names it: a SQLite file by its path, others masked."""
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else masked(url)


def directions(cfg: StudyConfig) -> list[str]:
    return ["maximize", "minimize"] if cfg.objective.pareto_latency else ["maximize"]


def metric_names(cfg: StudyConfig) -> list[str]:
    """What each objective value is, by name (optuna-dashboard and `optuna.visualization` label
    their axes with them, `study.trials_dataframe()` its columns)."""
    latency = cfg.objective.pareto_latency
    return [cfg.objective.metric, *([latency] if latency else [])]


def open_study(
    cfg: StudyConfig, storage: optuna.storages.BaseStorage, sampler: BaseSampler
) -> optuna.Study:
    """Create the study, or load it after checking its rows (study/rows.py) and that it was
    made from an equivalent study file."""
    study = optuna.create_study(
        study_name=cfg.study,
        storage=storage,
        sampler=sampler,
        directions=directions(cfg),
        load_if_exists=True,
    )
    url = str(getattr(storage, "url", ""))
    path = sqlite_path(url)
    check_rows(study, str(path) if path else masked(url), path)  # before a row is written
    mine = fingerprint(cfg)
    theirs = study.user_attrs.get(FINGERPRINT_ATTR)
    if theirs is not None and theirs == {**mine, "target": hosted_target_hash(cfg)}:
        theirs = None  # stored with the host in it, as before: brought up to date
    if theirs is None:
        study.set_user_attr(FINGERPRINT_ATTR, mine)
    elif theirs != mine:
        changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise StudyMismatchError(
            f"{cfg.source}: study '{cfg.study}' exists with a different {', '.join(changed)}; "
            "its trials would not be comparable. Give the study a new `study:` name "
            "(or another --runs-dir / --storage) to start afresh"
        )
    names = metric_names(cfg)
    if study.metric_names != names:  # named once; a study from before the names gets them here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    return study


def existing_study(cfg: StudyConfig, runs_dir: Path, storage: str | None = None) -> optuna.Study:
    """Load a study that `tuner tune` made (never create one), checking its fingerprint."""
    url = storage_url(cfg, runs_dir, storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise ConfigError(
            f"no study '{cfg.study}' yet ({url.removeprefix('sqlite:///')} does not exist): "
            f"run `tuner tune {cfg.source}` first",
            file=cfg.source,
        )
    storage_obj = make_storage(url, cfg.budget.infra_retries)
    try:
        optuna.load_study(study_name=cfg.study, storage=storage_obj)
    except KeyError:
        raise ConfigError(f"no study named '{cfg.study}' in {url}", file=cfg.source) from None
    return open_study(cfg, storage_obj, make_sampler(cfg))
