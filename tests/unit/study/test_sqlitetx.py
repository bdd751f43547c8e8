"""A SQLite study's transactions begin IMMEDIATE (study/sqlitetx.py): a transaction that has
only read already holds SQLite's write lock, so optuna's "read WAITING, set RUNNING" cannot
interleave with another process's (a fleet's workers on one study file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tuner.study.storage import DefaultURL, make_storage


def test_a_transaction_that_only_read_holds_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "s" / "study.db"
    storage = make_storage(DefaultURL(f"sqlite:///{db}"), 2)
    other = sqlite3.connect(db, timeout=0, isolation_level=None)  # another process's view
    try:
        with storage.engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("SELECT count(*) FROM trials").scalar()
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # free again once that transaction ended
        other.execute("ROLLBACK")
    finally:
        other.close()
        storage.engine.dispose()
