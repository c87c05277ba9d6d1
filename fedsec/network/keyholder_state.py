"""What the Paillier key holder keeps in its state directory, crash-safe.

``STATE_DIR`` (mode 0700) holds:

* ``paillier.key`` (mode 0600, JSON, written once: temp file, fsync, rename): the Paillier primes
  p and q, the X25519 tag secret, the 32-byte group MAC key, the threshold t and the key epoch.
  Nothing else in the deployment can decrypt; protect the file with disk encryption.
* ``keyholder.db`` (stdlib ``sqlite3``, WAL, ``synchronous = FULL``,
  :mod:`fedsec.state.durable`): the burned sequence numbers
  (:class:`fedsec.state.SqliteSequenceStore`, table ``burned``), the enrolled sites (table
  ``enrolled``: client id, certificate name, Ed25519 identity key; one id per name and one name per
  id, forever) and every registration the key holder accepted (table ``registrations``, in order),
  so a restarted key holder decrypts for the clients that registered before the crash.
* ``audit.db``: the key holder's signed audit log (:mod:`fedsec.audit.log`), written by
  :mod:`fedsec.network.keyholder`.

Every write is one ``BEGIN IMMEDIATE`` transaction, on disk when it returns.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import phe

from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.keys import KEY_BYTES, KeyPair
from fedsec.secagg.paillier import PaillierPublicKey
from fedsec.secagg.paillier.keys import SECURE_KEY_BITS, TEST_KEY_BITS, PaillierPrivateKey
from fedsec.state.durable import open_durable, transaction
from fedsec.state.sequences import SqliteSequenceStore

KEY_FILE = "paillier.key"
DB_FILE = "keyholder.db"
AUDIT_FILE = "audit.db"
KEY_FORMAT = "fedsec-keyholder-key-1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS enrolled (client_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                                     identity BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS certificates (client_id INTEGER PRIMARY KEY, pem BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS registrations (seq INTEGER PRIMARY KEY AUTOINCREMENT, key_id BLOB NOT NULL,
                                          epoch INTEGER NOT NULL, message BLOB NOT NULL);
"""


class EnrolmentConflict(ValueError):
    """A client id or a site name is already enrolled with something else (nothing changed)."""


@dataclass(frozen=True)
class KeyMaterial:
    """The key holder's secrets as read from ``paillier.key``."""

    private_key: PaillierPrivateKey
    tag_secret: bytes
    mac_key: bytes
    threshold: int
    epoch: int

    @property
    def public_key(self) -> PaillierPublicKey:
        return self.private_key.public_key


def _write_secret(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path`` (0600) atomically: temp file, fsync, rename, fsync dir."""
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def create_key(*, threshold: int, key_bits: int, allow_insecure: bool = False) -> tuple[KeyMaterial, dict]:
    """A fresh key (primes from ``phe``/gmpy2, secrets from the OS CSPRNG) and its JSON record.

    Args:
        threshold: fewest contributions a sum is decrypted for, >= 2.
        key_bits: modulus size, 2048 or 3072 (512/1024 with ``allow_insecure``, tests only).
    """
    if threshold < 2:
        raise ValueError(f"threshold: must be >= 2, got {threshold}")
    allowed = SECURE_KEY_BITS + (TEST_KEY_BITS if allow_insecure else ())
    if key_bits not in allowed:
        raise ValueError(f"key_bits: must be one of {allowed}, got {key_bits}")
    public, private = phe.generate_paillier_keypair(n_length=key_bits)
    record = {"format": KEY_FORMAT, "threshold": threshold, "epoch": 1, "n": format(public.n, "x"),
              "p": format(private.p, "x"), "q": format(private.q, "x"),
              "tag_secret": KeyPair.generate().private.hex(), "mac_key": os.urandom(KEY_BYTES).hex()}
    return _material(record, allow_insecure=allow_insecure), record


def _material(record: dict, *, allow_insecure: bool) -> KeyMaterial:
    n, p, q = (int(record[k], 16) for k in ("n", "p", "q"))
    if p * q != n:
        raise ValueError("state: paillier.key is damaged (p q != n)")
    public = PaillierPublicKey(n)
    if public.key_bits not in SECURE_KEY_BITS + (TEST_KEY_BITS if allow_insecure else ()):
        raise ValueError(f"state: paillier.key holds a {public.key_bits}-bit key")
    private = PaillierPrivateKey(public, phe.PaillierPrivateKey(phe.PaillierPublicKey(n), p, q))
    tag_secret, mac_key = bytes.fromhex(record["tag_secret"]), bytes.fromhex(record["mac_key"])
    if len(tag_secret) != KEY_BYTES or len(mac_key) != KEY_BYTES:
        raise ValueError("state: paillier.key is damaged (secret lengths)")
    return KeyMaterial(private, tag_secret, mac_key, int(record["threshold"]), int(record["epoch"]))


class KeyHolderState:
    """The key holder's state directory (created 0700 if missing).

    Args:
        directory: ``STATE_DIR``.
        threshold: t for a new key (required when no key exists yet); when a key exists, ``None``
            or the key's own t (another value is refused: a new t needs a new key).
        key_bits: modulus size of a new key.
        allow_insecure: allow 512/1024-bit keys (tests only).

    Raises:
        ValueError: (naming the argument) a missing threshold for a new key, a different one for
            the existing key, a damaged key file.
    """

    def __init__(self, directory: str | Path, *, threshold: int | None = None, key_bits: int = 2048,
                 allow_insecure: bool = False) -> None:
        self.directory = Path(directory)
        key_path = self.directory / KEY_FILE
        self.created = not key_path.exists()
        if self.created and (threshold is None or threshold < 2):
            raise ValueError("threshold: a new key holder needs --threshold T (>= 2)")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.created:
            self.key, record = create_key(threshold=threshold, key_bits=key_bits,
                                          allow_insecure=allow_insecure)
            _write_secret(key_path, json.dumps(record, sort_keys=True) + "\n")
        else:
            if key_path.stat().st_mode & 0o077:
                raise ValueError(f"state: {key_path} must be readable by its owner only (chmod 600)")
            try:
                record = json.loads(key_path.read_text())
                if record.get("format") != KEY_FORMAT:
                    raise ValueError("format")
                self.key = _material(record, allow_insecure=allow_insecure)
            except (ValueError, KeyError, TypeError, InvalidArgumentError) as error:
                raise ValueError(f"state: {key_path} is not a fedsec key holder key ({error})") from None
            if threshold is not None and threshold != self.key.threshold:
                raise ValueError(f"threshold: the key in {key_path} has t = {self.key.threshold}; "
                                 f"a different t needs a new key (a new state directory)")
        self.sequences = SqliteSequenceStore(self.directory / DB_FILE)
        self._db = open_durable(self.directory / DB_FILE, schema=_SCHEMA)

    @property
    def audit_path(self) -> Path:
        return self.directory / AUDIT_FILE

    def enrol(self, client_id: int, name: str, identity: bytes, certificate: bytes = b"") -> bool:
        """Record that ``client_id`` is the site ``name`` with Ed25519 key ``identity``, and the
        certificate (PEM) it was last enrolled with (checked again at every start, registration
        and decryption: revocation and ``--sites``, review S6-2).

        Returns True if new, False if exactly this was recorded before; raises
        :class:`EnrolmentConflict` if the id or the name is taken by something else."""
        with transaction(self._db):
            rows = self._db.execute("SELECT client_id, name, identity FROM enrolled WHERE client_id = ? "
                                    "OR name = ?", (client_id, name)).fetchall()
            if any((int(c), str(n), bytes(k)) != (client_id, name, identity) for c, n, k in rows):
                raise EnrolmentConflict(f"client {client_id} or site {name} is enrolled with another "
                                        "id, name or key")
            if certificate:
                self._db.execute("INSERT OR REPLACE INTO certificates (client_id, pem) VALUES (?, ?)",
                                 (client_id, certificate))
            if rows:
                return False
            self._db.execute("INSERT INTO enrolled (client_id, name, identity) VALUES (?, ?, ?)",
                             (client_id, name, identity))
        return True

    def certificate(self, client_id: int) -> bytes | None:
        """The certificate (PEM) ``client_id`` was last enrolled with, or None (none stored)."""
        row = self._db.execute("SELECT pem FROM certificates WHERE client_id = ?", (client_id,)).fetchone()
        return bytes(row[0]) if row else None

    def enrolled(self) -> list[tuple[int, str, bytes]]:
        """Every enrolment (client id, name, identity key), by id."""
        return [(int(c), str(n), bytes(k)) for c, n, k in
                self._db.execute("SELECT client_id, name, identity FROM enrolled ORDER BY client_id")]

    def record_registration(self, key_id: bytes, epoch: int, message: bytes) -> None:
        """Append an accepted registration message (durable when this returns)."""
        with transaction(self._db):
            self._db.execute("INSERT INTO registrations (key_id, epoch, message) VALUES (?, ?, ?)",
                             (bytes(key_id), epoch, bytes(message)))

    def registrations(self, key_id: bytes, epoch: int) -> list[bytes]:
        """The accepted registrations of this key and epoch, in the order they were accepted."""
        return [bytes(m) for (m,) in self._db.execute(
            "SELECT message FROM registrations WHERE key_id = ? AND epoch = ? ORDER BY seq",
            (bytes(key_id), epoch))]

    def close(self) -> None:
        self._db.close()
        self.sequences.close()
