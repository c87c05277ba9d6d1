"""One party's append-only audit log in SQLite (stdlib ``sqlite3``, WAL, synchronous FULL).

One file, ``audit.db``, two tables:

* ``header`` (key/value): ``format``, ``actor`` (the party's name), ``public_key`` (its Ed25519
  public key, 32 bytes in hex), ``fingerprint`` (SHA-256 of the raw public key, hex) and
  ``created`` (UTC, ISO 8601).
* ``events``: one row per event, ``seq`` 1, 2, 3, ... without gaps; ``time`` (UTC, ISO 8601 with
  microseconds), ``actor``, ``action``, ``run_id``, ``round`` (nullable), ``stage`` (nullable),
  ``details`` (canonical JSON: sorted keys, no spaces, ASCII), ``peer_ref`` (nullable: the other
  party's ``actor:seq:hash`` where a message links two logs), ``key_fp`` (fingerprint of the key
  that signed the row), ``prev_hash``, ``hash`` and ``signature``.

``hash`` = SHA-256 of :func:`canonical` (all fields above but ``hash`` and ``signature``, with
``prev_hash``); ``signature`` = Ed25519 over the 32 hash bytes. The first row's ``prev_hash`` is
:func:`genesis`, a hash of the header's actor and public key, so a chain cannot be moved under
another header. An append is one ``BEGIN IMMEDIATE`` transaction: it reads the head, writes the
row and commits (on disk when :meth:`AuditLog.append` returns, ``synchronous = FULL``).

Tail truncation (dropping the last rows and nothing else leaves a valid chain) is caught by a
peer: :meth:`AuditLog.head` exports the head, the peer records it with :meth:`AuditLog.ack`, and
:func:`fedsec.audit.verify.check_ack` later proves the acknowledged row is still in the log.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsec.secagg.keys import SigningKey
from fedsec.state.durable import open_durable

FORMAT = "fedsec-audit-1"
"""The ``header.format`` value this module writes and reads."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS header (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, time TEXT NOT NULL, "
    "actor TEXT NOT NULL, action TEXT NOT NULL, run_id TEXT NOT NULL, round INTEGER, stage TEXT, "
    "details TEXT NOT NULL, peer_ref TEXT, key_fp TEXT NOT NULL, prev_hash TEXT NOT NULL, "
    "hash TEXT NOT NULL, signature TEXT NOT NULL)",
)


@dataclass(frozen=True)
class Event:
    """One row of ``events`` as stored (``details`` is the stored JSON text)."""

    seq: int
    time: str
    actor: str
    action: str
    run_id: str
    round: int | None
    stage: str | None
    details: str
    peer_ref: str | None
    key_fp: str
    prev_hash: str
    hash: str
    signature: str

    def payload(self) -> dict[str, Any]:
        """``details`` parsed (raises ``json.JSONDecodeError`` on a damaged row)."""
        value = json.loads(self.details)
        if not isinstance(value, dict):
            raise ValueError("details: not a JSON object")
        return value


@dataclass(frozen=True)
class Head:
    """A log's head as a peer acknowledges it: who, how many rows, the last row's hash."""

    actor: str
    fingerprint: str
    seq: int
    hash: str

    def ref(self) -> str:
        return f"{self.actor}:{self.seq}:{self.hash}"


def fingerprint(public: bytes) -> str:
    """SHA-256 of a raw 32-byte Ed25519 public key, hex (64 characters)."""
    return hashlib.sha256(public).hexdigest()


def genesis(actor: str, public_hex: str) -> str:
    """The ``prev_hash`` of row 1: binds the chain to the header's actor and key."""
    return hashlib.sha256(json.dumps([FORMAT, actor, public_hex]).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no whitespace, ASCII only; NaN and infinities refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical(seq: int, time: str, actor: str, action: str, run_id: str, round_: int | None,
              stage: str | None, details: str, peer_ref: str | None, key_fp: str,
              prev_hash: str) -> bytes:
    """The bytes a row's hash covers (a JSON array of every field but hash and signature)."""
    return canonical_json([FORMAT, seq, time, actor, action, run_id, round_, stage, details, peer_ref,
                           key_fp, prev_hash]).encode()


def row_hash(event: Event) -> str:
    """Recompute ``event``'s hash from its other fields."""
    return hashlib.sha256(canonical(event.seq, event.time, event.actor, event.action, event.run_id,
                                    event.round, event.stage, event.details, event.peer_ref,
                                    event.key_fp, event.prev_hash)).hexdigest()


def _connect(path: Path) -> sqlite3.Connection:
    return open_durable(path)


class AuditLog:
    """The writer of one party's ``audit.db``.

    Args:
        path: the database file; its directory must exist. A new file gets a header for ``actor``
            and ``key``; an existing one must carry the same actor and public key.
        actor: the party's name (its certificate name in a deployment), non-empty.
        key: the party's Ed25519 signing key.
        run_id: the run or study this party's events belong to, non-empty.

    Raises:
        ValueError: (naming the argument) a missing directory, an empty name, or an existing log
            of another actor or key.
    """

    def __init__(self, path: str | Path, *, actor: str, key: SigningKey, run_id: str) -> None:
        if not actor:
            raise ValueError("actor: must be a non-empty name")
        if not run_id:
            raise ValueError("run_id: must be non-empty")
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ValueError(f"path: directory {self.path.parent} does not exist")
        self.actor, self.run_id, self._key = actor, run_id, key
        self._signer = Ed25519PrivateKey.from_private_bytes(key.private)  # built once, not per row
        self.fingerprint = fingerprint(key.public)
        self._db = _connect(self.path)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                self._db.execute(statement)
            header = dict(self._db.execute("SELECT key, value FROM header").fetchall())
            if not header:
                self._db.executemany("INSERT INTO header (key, value) VALUES (?, ?)", [
                    ("format", FORMAT), ("actor", actor), ("public_key", key.public.hex()),
                    ("fingerprint", self.fingerprint), ("created", _now())])
            elif header.get("actor") != actor or header.get("public_key") != key.public.hex():
                raise ValueError(f"path: {self.path} is the log of another actor or key")
        except BaseException:
            self._db.execute("ROLLBACK")
            self._db.close()
            raise
        self._db.execute("COMMIT")

    def append(self, action: str, *, round: int | None = None, stage: str | None = None,
               details: dict[str, Any] | None = None, peer_ref: str | None = None) -> Event:
        """Append one signed event atomically and return it (on disk when this returns).

        Raises:
            ValueError: an empty action, or details that are not a JSON object of finite values.
        """
        return self.append_many([(action, round, stage, details, peer_ref)])[0]

    def append_many(self, items: list[tuple[str, int | None, str | None, dict[str, Any] | None,
                                            str | None]]) -> list[Event]:
        """Append several events ``(action, round, stage, details, peer_ref)`` in one transaction
        (all or none; one fsync). Raises ValueError as :meth:`append` does, before writing any."""
        texts = []
        for action, _, _, details, _ in items:
            if not action:
                raise ValueError("action: must be non-empty")
            try:
                texts.append(canonical_json(details or {}))
            except (TypeError, ValueError) as error:
                raise ValueError(f"details: not canonical JSON ({error})") from None
        events = []
        self._db.execute("BEGIN IMMEDIATE")
        try:
            last = self._db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (0, genesis(self.actor, self._key.public.hex())) if last is None else (
                int(last[0]), str(last[1]))
            for (action, round_, stage, _, peer_ref), text in zip(items, texts):
                seq += 1
                stamp = _now()
                digest = hashlib.sha256(canonical(seq, stamp, self.actor, action, self.run_id, round_,
                                                  stage, text, peer_ref, self.fingerprint, prev)).digest()
                event = Event(seq, stamp, self.actor, action, self.run_id, round_, stage, text, peer_ref,
                              self.fingerprint, prev, digest.hex(), self._signer.sign(digest).hex())
                events.append(event)
                prev = event.hash
            self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 [(e.seq, e.time, e.actor, e.action, e.run_id, e.round, e.stage, e.details,
                                   e.peer_ref, e.key_fp, e.prev_hash, e.hash, e.signature) for e in events])
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return events

    def head(self) -> Head:
        """The current head (``seq`` 0 and the genesis hash for an empty log)."""
        last = self._db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        if last is None:
            return Head(self.actor, self.fingerprint, 0, genesis(self.actor, self._key.public.hex()))
        return Head(self.actor, self.fingerprint, int(last[0]), str(last[1]))

    def ack(self, head: Head, *, round: int | None = None) -> Event:
        """Record a peer's head (an ``ack`` event): the peer can no longer drop rows up to it."""
        return self.append("ack", round=round, details={"actor": head.actor, "fingerprint":
                                                        head.fingerprint, "seq": head.seq,
                                                        "hash": head.hash}, peer_ref=head.ref())

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_header(path: str | Path) -> dict[str, str]:
    """The header of the log at ``path`` (read-only).

    Raises:
        ValueError: (key ``path``) no such file, or not an audit log.
    """
    db = _open_read(path)
    try:
        return dict(db.execute("SELECT key, value FROM header").fetchall())
    except sqlite3.DatabaseError:
        raise ValueError(f"path: {path} is not a fedsec audit log") from None
    finally:
        db.close()


def read_events(path: str | Path, *, round: int | None = None) -> list[Event]:
    """Every event of the log at ``path`` in ``seq`` order (only round ``round`` if given)."""
    db = _open_read(path)
    try:
        query, args = "SELECT * FROM events", ()
        if round is not None:
            query, args = query + " WHERE round = ?", (round,)
        rows = db.execute(query + " ORDER BY seq", args).fetchall()
    except sqlite3.DatabaseError:
        raise ValueError(f"path: {path} is not a fedsec audit log") from None
    finally:
        db.close()
    return [Event(*row) for row in rows]


def _open_read(path: str | Path) -> sqlite3.Connection:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"path: no file {file}")
    return sqlite3.connect(f"{file.absolute().as_uri()}?mode=ro", uri=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
