"""The messages of threshold custody's decryption, and their canonical encoding (no pickle).

Magic ``FSPT``, a version and a kind byte, like :mod:`protocols.paillier.messages`:

- :class:`VerificationKeys`: dealer to everyone, signed: v and v_1..v_N for the announced key;
- :class:`ContributorList`: server to every party: the aggregation's spec and, per contributor,
  its id and the SHA-256 of its whole submission message;
- :class:`Endorsement`: party to server: its signature on the list's digest (at most one list per
  aggregation sequence number, :mod:`protocols.paillier.party`);
- :class:`CertifiedRequest`: server to decrypting parties: the spec, the submissions and a quorum
  of endorsements on their list;
- :class:`VerifiedShares`: party to server: its decryption shares and their proof.

:func:`decode` refuses anything of another kind, short, long or out of range with
:class:`~protocols.errors.MalformedMessage`.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.wire import Writer, open_envelope, start_envelope
from fedsec.secagg.keys import SIGNATURE_BYTES
from fedsec.secagg.paillier.keys import KEY_ID_BYTES

_MAGIC = b"FSPT"
_VERSION = 1
KEYS_DOMAIN = b"fedsec/paillier/verification-keys/v1"
ENDORSE_DOMAIN = b"fedsec/paillier/endorse/v1"
_ENTRY = struct.Struct(">Q32s")
_ENDORSER = struct.Struct(f">Q{SIGNATURE_BYTES}s")


@dataclass(frozen=True)
class VerificationKeys:
    """Dealer to everyone: for the key named by ``key_id``, t, the N party ids in share-index
    order, v and (v_1, ..., v_N); signed with the dealer's identity key."""

    key_id: bytes
    threshold: int
    parties: tuple[int, ...]
    base: bytes
    keys: tuple[bytes, ...]
    signature: bytes = b""

    KIND = 1

    def signed_part(self) -> bytes:
        w = Writer().fixed(self.key_id, KEY_ID_BYTES).u32(self.threshold).ids(self.parties)
        w.blob(self.base).u32(len(self.keys))
        for key in self.keys:
            w.blob(key)
        return w.getvalue()


@dataclass(frozen=True)
class ContributorList:
    """Server to parties: one aggregation's spec and its contributors as (client id, SHA-256 of
    the submission message), sorted by id."""

    spec: bytes
    entries: tuple[tuple[int, bytes], ...]

    KIND = 2

    def digest(self, key_id: bytes) -> bytes:
        """What an endorsement signs: the key, the spec and every entry."""
        body = Writer().fixed(key_id, KEY_ID_BYTES).blob(self.spec).records(_ENTRY, self.entries)
        return hashlib.sha256(ENDORSE_DOMAIN + body.getvalue()).digest()


@dataclass(frozen=True)
class Endorsement:
    """Party to server: ``party`` (a client id) signs the digest of one contributor list for the
    aggregation ``sequence``."""

    party: int
    sequence: int
    list_digest: bytes
    signature: bytes = b""

    KIND = 3

    def signed_part(self) -> bytes:
        return Writer().u64(self.party).u64(self.sequence).fixed(self.list_digest, 32).getvalue()


@dataclass(frozen=True)
class CertifiedRequest:
    """Server to decrypting parties: the spec, every summed submission message, and endorsements
    (party id, signature) on the list they make."""

    spec: bytes
    submissions: tuple[bytes, ...]
    endorsements: tuple[tuple[int, bytes], ...]

    KIND = 4


@dataclass(frozen=True)
class VerifiedShares:
    """Party to server: its decryption shares of the product (a ciphertext batch) and the proof
    that they are right."""

    sequence: int
    party: int
    batch: bytes
    proof: bytes

    KIND = 5


Message = VerificationKeys | ContributorList | Endorsement | CertifiedRequest | VerifiedShares


def encode(message: Message) -> bytes:
    w = start_envelope(_MAGIC, _VERSION, message.KIND)
    if isinstance(message, VerificationKeys):
        w.fixed(message.key_id, KEY_ID_BYTES).u32(message.threshold).ids(message.parties)
        w.blob(message.base).u32(len(message.keys))
        for key in message.keys:
            w.blob(key)
        w.fixed(message.signature, SIGNATURE_BYTES)
    elif isinstance(message, ContributorList):
        w.blob(message.spec).records(_ENTRY, message.entries)
    elif isinstance(message, Endorsement):
        w.u64(message.party).u64(message.sequence).fixed(message.list_digest, 32)
        w.fixed(message.signature, SIGNATURE_BYTES)
    elif isinstance(message, CertifiedRequest):
        w.blob(message.spec).u32(len(message.submissions))
        for submission in message.submissions:
            w.blob(submission)
        w.records(_ENDORSER, message.endorsements)
    elif isinstance(message, VerifiedShares):
        w.u64(message.sequence).u32(message.party).blob(message.batch).blob(message.proof)
    else:
        raise MalformedMessage(f"cannot encode {type(message).__name__}")
    return w.getvalue()


def decode(data: bytes, kind: type[Message]) -> Message:
    """Parse ``data`` as a message of type ``kind``; anything else raises MalformedMessage."""
    r = open_envelope(data, _MAGIC, _VERSION, kind.KIND, family="threshold", name=kind.__name__)
    if kind is VerificationKeys:
        key_id, threshold, parties, base = r.fixed(KEY_ID_BYTES), r.u32(), r.ids(), bytes(r.view())
        keys = tuple(bytes(r.view()) for _ in range(r.count()))
        message = VerificationKeys(key_id, threshold, parties, base, keys, r.fixed(SIGNATURE_BYTES))
    elif kind is ContributorList:
        message = ContributorList(bytes(r.view()), tuple(r.records(_ENTRY)))
    elif kind is Endorsement:
        message = Endorsement(r.u64(), r.u64(), r.fixed(32), r.fixed(SIGNATURE_BYTES))
    elif kind is CertifiedRequest:
        spec = bytes(r.view())
        submissions = tuple(bytes(r.view()) for _ in range(r.count()))
        message = CertifiedRequest(spec, submissions, tuple(r.records(_ENDORSER)))
    elif kind is VerifiedShares:
        message = VerifiedShares(r.u64(), r.u32(), bytes(r.view()), bytes(r.view()))
    else:
        raise MalformedMessage(f"unknown message type {kind!r}")
    r.end()
    return message
