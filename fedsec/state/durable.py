"""The one recipe for state that must survive a crash: stdlib ``sqlite3`` in WAL mode with
``synchronous = FULL`` (a commit is on disk when it returns), explicit ``BEGIN IMMEDIATE``
transactions that either commit whole or roll back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def open_durable(path: str | Path, *, schema: str = "") -> sqlite3.Connection:
    """Open (or create) the database at ``path`` for durable writes and apply ``schema``.

    Raises:
        ValueError: the directory of ``path`` does not exist.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"path: directory {path.parent} does not exist")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    if schema:
        db.executescript(schema)
    return db


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction: committed if the block ends normally, rolled back on
    any exception (which propagates)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
