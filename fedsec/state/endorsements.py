"""A threshold party's endorsed contributor lists in SQLite (stdlib ``sqlite3``, WAL, synchronous
FULL).

Implements :class:`protocols.paillier.state.EndorsementStore`: one row per (Paillier key id,
sequence number) holding the SHA-256 digest of the one contributor list the party endorsed. An
endorsement is one ``BEGIN IMMEDIATE`` transaction that reads the row, refuses a different digest
and inserts a missing one; with ``synchronous = FULL`` the commit is on disk when
:meth:`endorse` returns, so a party that restarts on the same file still refuses a second list of
an aggregation it endorsed before.
"""

from __future__ import annotations

from pathlib import Path

from fedsec.protocols.paillier.state import EndorsementConflict, check_endorsement
from fedsec.state.durable import open_durable, transaction

_SCHEMA = ("CREATE TABLE IF NOT EXISTS endorsed (key_id BLOB NOT NULL, sequence BLOB NOT NULL, "
           "digest BLOB NOT NULL, PRIMARY KEY (key_id, sequence))")


def _sequence(sequence: int) -> bytes:
    """u64 sequence numbers as 8 big-endian bytes (SQLite integers are signed 64-bit)."""
    return sequence.to_bytes(8, "big")


class SqliteEndorsementStore:
    """Endorsed list digests in the SQLite database at ``path`` (created if missing).

    Args:
        path: database file, e.g. ``STATE_DIR/party.db``; its directory must exist.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = open_durable(self.path, schema=_SCHEMA)

    def endorsed(self, key_id: bytes, sequence: int) -> bytes | None:
        check_endorsement(sequence, bytes(32))
        row = self._db.execute("SELECT digest FROM endorsed WHERE key_id = ? AND sequence = ?",
                               (bytes(key_id), _sequence(sequence))).fetchone()
        return None if row is None else bytes(row[0])

    def endorse(self, key_id: bytes, sequence: int, digest: bytes) -> None:
        check_endorsement(sequence, digest)
        with transaction(self._db):
            known = self.endorsed(key_id, sequence)
            if known is None:
                self._db.execute("INSERT INTO endorsed (key_id, sequence, digest) VALUES (?, ?, ?)",
                                 (bytes(key_id), _sequence(sequence), bytes(digest)))
            elif known != digest:
                raise EndorsementConflict(f"another list is endorsed for sequence {sequence}")

    def close(self) -> None:
        self._db.close()
