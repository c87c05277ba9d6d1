"""The messages of the Paillier protocol and their canonical encoding (no pickle).

Each message starts with magic ``FSPM``, a version and a kind byte; :func:`decode` refuses a
message of another kind, a short or long one, or a field out of range with
:class:`~protocols.errors.MalformedMessage`. Ciphertext batches are carried as opaque blobs and
validated by :func:`secagg.paillier.decode_batch` where they are used.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.wire import Reader, Writer, open_envelope, start_envelope
from fedsec.secagg.keys import KEY_BYTES, SIGNATURE_BYTES
from fedsec.secagg.paillier.keys import KEY_ID_BYTES

_MAGIC = b"FSPM"
_VERSION = 1
ANNOUNCE_DOMAIN = b"fedsec/paillier/announce/v1"
REGISTER_DOMAIN = b"fedsec/paillier/register/v1"
SUBMIT_DOMAIN = b"fedsec/paillier/submit/v1"
REQUEST_DOMAIN = b"fedsec/paillier/decryption-request/v1"
KEY_HOLDER, THRESHOLD = 1, 2
"""Custody codes: one key holder decrypts, or t of the clients' key shares do."""


@dataclass(frozen=True)
class Announcement:
    """Key holder (or threshold dealer) to everyone: the custody code, the Paillier public key,
    the X25519 key for tags (key-holder custody; zeros otherwise), the threshold and the key
    epoch (>= 1; a client only ever moves to a higher one). Signed with the announcer's identity
    key, which clients know beforehand."""

    custody: int
    public_key: bytes
    tag_public: bytes
    threshold: int
    signature: bytes = b""
    epoch: int = 1

    KIND = 1

    def signed_part(self) -> bytes:
        return (Writer().u8(self.custody).blob(self.public_key).fixed(self.tag_public, KEY_BYTES)
                .u32(self.threshold).u64(self.epoch).getvalue())


@dataclass(frozen=True)
class Registration:
    """Client to key holder (relayed by the server): the client's X25519 key for tags for the
    key ``key_id`` at key epoch ``epoch``, signed with the client's identity key (a registration
    of another epoch is refused, so an old one cannot be replayed)."""

    client_id: int
    key_id: bytes
    tag_public: bytes
    signature: bytes = b""
    epoch: int = 1

    KIND = 2

    def signed_part(self) -> bytes:
        return (Writer().u64(self.client_id).fixed(self.key_id, KEY_ID_BYTES).u64(self.epoch)
                .fixed(self.tag_public, KEY_BYTES).getvalue())


@dataclass(frozen=True)
class Submission:
    """Client to server: its encrypted, packed (and tagged) words for the aggregation named by
    the digest, signed with the client's identity key; under threshold custody also its proof of
    plaintext knowledge (:mod:`protocols.paillier.knowledge`), empty otherwise."""

    client_id: int
    spec_digest: bytes
    batch: bytes
    signature: bytes = b""
    proof: bytes = b""

    KIND = 3

    def signed_part(self) -> bytes:
        w = (Writer().u64(self.client_id).fixed(self.spec_digest, 32)
             .fixed(hashlib.sha256(self.batch).digest(), 32))
        if self.proof:
            w.fixed(hashlib.sha256(self.proof).digest(), 32)
        return w.getvalue()


@dataclass(frozen=True)
class DecryptionRequest:
    """Server to key holder: the spec, who contributed, the product of their ciphertexts and the
    names of the roster the spec's roster digest commits to (sorted; the key holder checks them
    against the digest and every contributor's enrolled name against them), signed with the
    server's identity key (the key holder checks it before anything else)."""

    spec: bytes
    participants: tuple[int, ...]
    batch: bytes
    signature: bytes = b""
    roster: tuple[str, ...] = ()

    KIND = 4

    def signed_part(self) -> bytes:
        w = (Writer().blob(self.spec).ids(self.participants)
             .fixed(hashlib.sha256(self.batch).digest(), 32))
        return _names(w, self.roster).getvalue()


def _names(w: Writer, names: tuple[str, ...]) -> Writer:
    w.u32(len(names))
    for name in names:
        w.blob(name.encode("utf-8"))
    return w


def _read_names(r: Reader) -> tuple[str, ...]:
    names = []
    for _ in range(r.count()):
        try:
            names.append(bytes(r.view()).decode("utf-8"))
        except UnicodeDecodeError:
            raise MalformedMessage("a roster name is not UTF-8") from None
    return tuple(names)


@dataclass(frozen=True)
class Welcome:
    """Key holder to one registered client (relayed by the server): the group MAC key of this
    Paillier key and epoch, sealed (AES-GCM) under a key only that client and the key holder
    derive from their X25519 agreement."""

    client_id: int
    key_id: bytes
    epoch: int
    sealed: bytes

    KIND = 16


@dataclass(frozen=True)
class Refusal:
    """Key holder to server: "refused", with no field at all, whatever the reason (the reason
    stays in the key holder's own record)."""

    KIND = 17


@dataclass(frozen=True)
class DecryptionResult:
    """Key holder to server: the verified sum of the words (the count word last)."""

    sequence: int
    participants: tuple[int, ...]
    words: np.ndarray

    KIND = 5


Message = (Announcement | Registration | Submission | DecryptionRequest | DecryptionResult
           | Welcome | Refusal)


def encode(message: Message) -> bytes:
    w = start_envelope(_MAGIC, _VERSION, message.KIND)
    if isinstance(message, Announcement):
        w.u8(message.custody).blob(message.public_key).fixed(message.tag_public, KEY_BYTES)
        w.u32(message.threshold).u64(message.epoch).fixed(message.signature, SIGNATURE_BYTES)
    elif isinstance(message, Registration):
        w.u64(message.client_id).fixed(message.key_id, KEY_ID_BYTES).u64(message.epoch)
        w.fixed(message.tag_public, KEY_BYTES).fixed(message.signature, SIGNATURE_BYTES)
    elif isinstance(message, Submission):
        w.u64(message.client_id).fixed(message.spec_digest, 32).blob(message.batch)
        w.fixed(message.signature, SIGNATURE_BYTES).blob(message.proof)
    elif isinstance(message, DecryptionRequest):
        w.blob(message.spec).ids(message.participants).blob(message.batch)
        w.fixed(message.signature, SIGNATURE_BYTES)
        _names(w, message.roster)
    elif isinstance(message, Welcome):
        w.u64(message.client_id).fixed(message.key_id, KEY_ID_BYTES).u64(message.epoch)
        w.blob(message.sealed)
    elif isinstance(message, Refusal):
        pass
    elif isinstance(message, DecryptionResult):
        w.u64(message.sequence).ids(message.participants)
        w.blob(np.ascontiguousarray(message.words, dtype="<u8").tobytes())
    else:
        raise MalformedMessage(f"cannot encode {type(message).__name__}")
    return w.getvalue()


def decode(data: bytes, kind: type[Message]) -> Message:
    """Parse ``data`` as a message of type ``kind``; anything else raises MalformedMessage."""
    r = open_envelope(data, _MAGIC, _VERSION, kind.KIND, family="Paillier", name=kind.__name__)
    if kind is Announcement:
        custody = r.u8()
        if custody not in (KEY_HOLDER, THRESHOLD):
            raise MalformedMessage("unknown custody code")
        public_key, tag_public, threshold = bytes(r.view()), r.fixed(KEY_BYTES), r.u32()
        epoch = r.u64()
        message = Announcement(custody, public_key, tag_public, threshold,
                               r.fixed(SIGNATURE_BYTES), epoch)
    elif kind is Registration:
        client_id, key_id, epoch = r.u64(), r.fixed(KEY_ID_BYTES), r.u64()
        message = Registration(client_id, key_id, r.fixed(KEY_BYTES), r.fixed(SIGNATURE_BYTES), epoch)
    elif kind is Submission:
        message = Submission(r.u64(), r.fixed(32), bytes(r.view()), r.fixed(SIGNATURE_BYTES),
                             bytes(r.view()))
    elif kind is DecryptionRequest:
        message = DecryptionRequest(bytes(r.view()), r.ids(), bytes(r.view()),
                                    r.fixed(SIGNATURE_BYTES), _read_names(r))
    elif kind is Welcome:
        message = Welcome(r.u64(), r.fixed(KEY_ID_BYTES), r.u64(), bytes(r.view()))
    elif kind is Refusal:
        message = Refusal()
    elif kind is DecryptionResult:
        sequence, participants, raw = r.u64(), r.ids(), r.view()
        if len(raw) % 8:
            raise MalformedMessage("result words are not whole 64-bit words")
        message = DecryptionResult(sequence, participants,
                                   np.frombuffer(raw, dtype="<u8").astype(np.uint64))
    else:
        raise MalformedMessage(f"unknown message type {kind!r}")
    r.end()
    return message
