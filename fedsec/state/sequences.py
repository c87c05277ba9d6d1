"""The key holder's burned sequence numbers in SQLite (stdlib ``sqlite3``, WAL, synchronous FULL).

Implements :class:`protocols.paillier.state.SequenceStore`: one row per Paillier key id holding
the last burned sequence number. A burn is one ``BEGIN IMMEDIATE`` transaction that reads the
row, applies the next-number rule and writes it; with ``synchronous = FULL`` the commit is on
disk when :meth:`burn` returns, so a key holder that crashes right after burning still refuses
that number when it restarts on the same file.
"""

from __future__ import annotations

from pathlib import Path

from fedsec.protocols.paillier.state import check_next
from fedsec.state.durable import open_durable, transaction

_SCHEMA = "CREATE TABLE IF NOT EXISTS burned (key_id BLOB PRIMARY KEY, sequence INTEGER NOT NULL)"


class SqliteSequenceStore:
    """Burned sequence numbers in the SQLite database at ``path`` (created if missing).

    Args:
        path: database file, e.g. ``STATE_DIR/keyholder.db``; its directory must exist.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = open_durable(self.path, schema=_SCHEMA)

    def last_burned(self, key_id: bytes) -> int:
        row = self._db.execute("SELECT sequence FROM burned WHERE key_id = ?",
                               (bytes(key_id),)).fetchone()
        return 0 if row is None else int(row[0])

    def burn(self, key_id: bytes, sequence: int) -> None:
        with transaction(self._db):
            check_next(self.last_burned(key_id), sequence)
            self._db.execute("INSERT INTO burned (key_id, sequence) VALUES (?, ?) ON CONFLICT(key_id) "
                             "DO UPDATE SET sequence = excluded.sequence", (bytes(key_id), sequence))

    def close(self) -> None:
        self._db.close()
