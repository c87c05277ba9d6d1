"""The messages of the pairwise-mask protocol and their canonical wire form.

Every message starts with the same header: magic ``FSM1``, kind, 16-byte session id, round,
sender and recipient (the server is ``SERVER``). :func:`decode` checks the header against what
the receiver expects (kind, session, round, sender or recipient) before the body is trusted.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.masked.keys import COMMITMENT_BYTES
from fedsec.protocols.wire import Reader, Writer
from fedsec.secagg.keys import KEY_BYTES, NONCE_BYTES, SIGNATURE_BYTES, TAG_BYTES
from fedsec.secagg.shamir import SHARE_BYTES

MAGIC = b"FSM1"
SESSION_BYTES = 16
SERVER = 2**64 - 1
SHARE_OF_SEED = 0
SHARE_OF_MASK_KEY = 1
SEALED_BYTES = NONCE_BYTES + 2 * SHARE_BYTES + TAG_BYTES
"""Size of one sealed share bundle: nonce, the two shares, the GCM tag."""

SHARE_HASHES_PER_HOLDER = 2
"""Share commitments per holder: SHA-256 of its seed share, then of its mask-key share."""

_KEY = struct.Struct(f">Q{KEY_BYTES}s{KEY_BYTES}s{COMMITMENT_BYTES}s")
_SIGNED_KEY = struct.Struct(f">Q{KEY_BYTES}s{KEY_BYTES}s{COMMITMENT_BYTES}s{SIGNATURE_BYTES}s")
_SEALED = struct.Struct(f">Q{SEALED_BYTES}s")
_SIGNATURE = struct.Struct(f">Q{SIGNATURE_BYTES}s")
_SHARE = struct.Struct(f">QB{SHARE_BYTES}s")


@dataclass(frozen=True)
class Header:
    kind: int
    session: bytes
    round: int
    sender: int
    recipient: int


@dataclass(frozen=True)
class SessionParams:
    """Server -> client: who is in the round and every public parameter of it."""

    KIND: ClassVar[int] = 1
    ring: tuple[int, ...]
    degree: int
    threshold: int
    length: int
    clip: float
    bits: int
    max_clients: int
    max_weight: int
    max_length: int
    active: bool
    word_slack: int = 0

    def write(self, w: Writer) -> None:
        w.ids(self.ring).u32(self.degree).u32(self.threshold).u64(self.length).f64(self.clip)
        w.u8(self.bits).u32(self.max_clients).u64(self.max_weight).u64(self.max_length)
        w.u8(int(self.active)).u64(self.word_slack)

    @classmethod
    def read(cls, r: Reader) -> SessionParams:
        params = cls(r.ids(), r.u32(), r.u32(), r.u64(), r.f64(), r.u8(), r.u32(), r.u64(), r.u64(),
                     bool(r.u8()), r.u64())
        if not math.isfinite(params.clip):
            raise MalformedMessage("clip is not finite")
        return params


@dataclass(frozen=True)
class KeyEntry:
    """One client's advertised keys: X25519 encryption and mask public keys, the digest of its
    share commitments, and (active mode) its long-term signature over all of them."""

    client: int
    encryption_key: bytes
    mask_key: bytes
    commitment: bytes
    signature: bytes


def _write_key_entries(w: Writer, entries: tuple[KeyEntry, ...]) -> None:
    signed = bool(entries) and bool(entries[0].signature)
    if any(bool(e.signature) != signed for e in entries):
        raise MalformedMessage("key entries must all be signed or all unsigned")
    w.u8(int(signed))
    if signed:
        w.records(_SIGNED_KEY, [(e.client, e.encryption_key, e.mask_key, e.commitment, e.signature)
                                for e in entries])
    else:
        w.records(_KEY, [(e.client, e.encryption_key, e.mask_key, e.commitment) for e in entries])


def _read_key_entries(r: Reader) -> tuple[KeyEntry, ...]:
    signed = r.u8()
    if signed not in (0, 1):
        raise MalformedMessage("bad signature flag")
    if signed:
        return tuple(KeyEntry(*row) for row in r.records(_SIGNED_KEY))
    return tuple(KeyEntry(c, e, k, h, b"") for c, e, k, h in r.records(_KEY))


@dataclass(frozen=True)
class AdvertiseKeys:
    """Client -> server: its two fresh X25519 public keys (and their signature, active mode)."""

    KIND: ClassVar[int] = 2
    entry: KeyEntry

    def write(self, w: Writer) -> None:
        _write_key_entries(w, (self.entry,))

    @classmethod
    def read(cls, r: Reader) -> AdvertiseKeys:
        entries = _read_key_entries(r)
        if len(entries) != 1:
            raise MalformedMessage("an advertisement carries exactly one key entry")
        return cls(entries[0])


@dataclass(frozen=True)
class KeyList:
    """Server -> client: the advertised keys of the client's neighbours (and its own)."""

    KIND: ClassVar[int] = 3
    entries: tuple[KeyEntry, ...]

    def write(self, w: Writer) -> None:
        _write_key_entries(w, self.entries)

    @classmethod
    def read(cls, r: Reader) -> KeyList:
        return cls(_read_key_entries(r))


def _write_sealed(w: Writer, sealed: tuple[tuple[int, bytes], ...]) -> None:
    if any(len(blob) != SEALED_BYTES for _, blob in sealed):
        raise MalformedMessage(f"sealed share bundles are {SEALED_BYTES} bytes")
    w.records(_SEALED, sealed)


@dataclass(frozen=True)
class ShareKeys:
    """Client -> server: one sealed share bundle per neighbour, keyed by recipient, and the
    commitments to its shares: for x = 1..k, SHA-256 of the seed share then of the mask-key share
    (:func:`protocols.masked.keys.share_hash`); their digest is in its signed key entry."""

    KIND: ClassVar[int] = 4
    sealed: tuple[tuple[int, bytes], ...]
    commitments: bytes = b""

    def write(self, w: Writer) -> None:
        _write_sealed(w, self.sealed)
        w.blob(self.commitments)

    @classmethod
    def read(cls, r: Reader) -> ShareKeys:
        sealed = tuple(r.records(_SEALED))
        commitments = bytes(r.view())
        if len(commitments) % (SHARE_HASHES_PER_HOLDER * COMMITMENT_BYTES):
            raise MalformedMessage("share commitments are not whole hashes")
        return cls(sealed, commitments)


@dataclass(frozen=True)
class ForwardedShares:
    """Server -> client: the sealed bundles addressed to it, keyed by sender."""

    KIND: ClassVar[int] = 5
    sealed: tuple[tuple[int, bytes], ...]

    def write(self, w: Writer) -> None:
        _write_sealed(w, self.sealed)

    @classmethod
    def read(cls, r: Reader) -> ForwardedShares:
        return cls(tuple(r.records(_SEALED)))


def _signature_or_none(r: Reader) -> bytes:
    signature = bytes(r.view())
    if len(signature) not in (0, SIGNATURE_BYTES):
        raise MalformedMessage(f"a signature is {SIGNATURE_BYTES} bytes")
    return signature


@dataclass(frozen=True)
class MaskedInput:
    """Client -> server: its masked input words, ceil(b / 8) bytes each, and its attestation of
    the partners it masked with (a bitmap by x-coordinate; signed in active mode)."""

    KIND: ClassVar[int] = 6
    words: bytes | memoryview
    partners: bytes = b""
    signature: bytes = b""

    def write(self, w: Writer) -> None:
        if len(self.signature) not in (0, SIGNATURE_BYTES):
            raise MalformedMessage(f"signatures are {SIGNATURE_BYTES} bytes")
        w.blob(bytes(self.words)).blob(self.partners).blob(self.signature)

    @classmethod
    def read(cls, r: Reader) -> MaskedInput:
        return cls(r.view(), bytes(r.view()), _signature_or_none(r))


@dataclass(frozen=True)
class ConsistencyRequest:
    """Server -> client (active mode): the clients whose masked inputs the server holds."""

    KIND: ClassVar[int] = 7
    survivors: tuple[int, ...]

    def write(self, w: Writer) -> None:
        w.ids(self.survivors)

    @classmethod
    def read(cls, r: Reader) -> ConsistencyRequest:
        return cls(r.ids())


@dataclass(frozen=True)
class ConsistencySignature:
    """Client -> server (active mode): its signature over the survivor list."""

    KIND: ClassVar[int] = 8
    signature: bytes

    def write(self, w: Writer) -> None:
        w.fixed(self.signature, SIGNATURE_BYTES)

    @classmethod
    def read(cls, r: Reader) -> ConsistencySignature:
        return cls(r.fixed(SIGNATURE_BYTES))


@dataclass(frozen=True)
class UnmaskRequest:
    """Server -> client: neighbours alive and dropped; in active mode also the signatures over
    the survivor list and, for each alive neighbour asked about that did not sign it, its signed
    partner attestation (owner, partner bitmap, signature), all bitmaps of one size."""

    KIND: ClassVar[int] = 9
    alive: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: tuple[tuple[int, bytes], ...] = ()
    attestations: tuple[tuple[int, bytes, bytes], ...] = ()

    def write(self, w: Writer) -> None:
        if any(len(sig) != SIGNATURE_BYTES for _, sig in self.signatures):
            raise MalformedMessage(f"signatures are {SIGNATURE_BYTES} bytes")
        size = len(self.attestations[0][1]) if self.attestations else 0
        if any(len(bits) != size for _, bits, _ in self.attestations):
            raise MalformedMessage("attestation bitmaps differ in size")
        w.ids(self.alive).ids(self.dropped).records(_SIGNATURE, self.signatures)
        w.u32(size).records(_attestation_layout(size), self.attestations)

    @classmethod
    def read(cls, r: Reader) -> UnmaskRequest:
        alive, dropped, signatures = r.ids(), r.ids(), tuple(r.records(_SIGNATURE))
        size = r.u32()
        if size > MAX_BITMAP_BYTES:
            raise MalformedMessage("attestation bitmap too large")
        return cls(alive, dropped, signatures, tuple(r.records(_attestation_layout(size))))


MAX_BITMAP_BYTES = 1 << 17
"""Largest partner bitmap accepted (degrees up to 2^20)."""


def _attestation_layout(size: int) -> struct.Struct:
    return struct.Struct(f">Q{size}s{SIGNATURE_BYTES}s")


@dataclass(frozen=True)
class UnmaskResponse:
    """Client -> server: (owner, which secret, share) for each neighbour it was asked about."""

    KIND: ClassVar[int] = 10
    shares: tuple[tuple[int, int, bytes], ...]

    def write(self, w: Writer) -> None:
        if any(len(share) != SHARE_BYTES for _, _, share in self.shares):
            raise MalformedMessage(f"shares are {SHARE_BYTES} bytes")
        w.records(_SHARE, self.shares)

    @classmethod
    def read(cls, r: Reader) -> UnmaskResponse:
        shares = tuple(r.records(_SHARE))
        if any(which not in (SHARE_OF_SEED, SHARE_OF_MASK_KEY) for _, which, _ in shares):
            raise MalformedMessage("unknown share kind")
        return cls(shares)


SEALED_ROW = np.dtype([("peer", ">u8"), ("bundle", f"V{SEALED_BYTES}")])
"""One ShareKeys / ForwardedShares record as the wire lays it out (``_SEALED``): peer id, bundle."""


@dataclass(frozen=True, eq=False)
class SharedBundles:
    """The server's reading of a :class:`ShareKeys`: the same bytes, refused for the same reasons,
    with the sealed bundles as one structured array (``SEALED_ROW``; ``peer`` is the recipient)
    instead of one tuple per bundle."""

    KIND: ClassVar[int] = ShareKeys.KIND
    rows: np.ndarray
    commitments: bytes

    @classmethod
    def read(cls, r: Reader) -> SharedBundles:
        rows = r.record_array(SEALED_ROW)
        commitments = bytes(r.view())
        if len(commitments) % (SHARE_HASHES_PER_HOLDER * COMMITMENT_BYTES):
            raise MalformedMessage("share commitments are not whole hashes")
        return cls(rows, commitments)


_SHARE_ROW = np.dtype([("owner", ">u8"), ("kind", "u1"), ("share", "u1", (SHARE_BYTES,))])
"""One UnmaskResponse record as the wire lays it out (``_SHARE``)."""


@dataclass(frozen=True, eq=False)
class UnmaskShares:
    """The server's reading of an :class:`UnmaskResponse`: the same bytes, refused for the same
    reasons, read as arrays instead of one tuple per share.

    Attributes:
        owners: the owner of each share (uint64), in message order.
        kinds: which secret (int64, SHARE_OF_SEED or SHARE_OF_MASK_KEY).
        shares: the serialised shares, one row of SHARE_BYTES (uint8) each.
    """

    KIND: ClassVar[int] = UnmaskResponse.KIND
    owners: np.ndarray
    kinds: np.ndarray
    shares: np.ndarray

    @classmethod
    def read(cls, r: Reader) -> UnmaskShares:
        rows = r.record_array(_SHARE_ROW)
        kinds = rows["kind"].astype(np.int64)
        if kinds.size and int(kinds.max()) > SHARE_OF_MASK_KEY:  # kinds are unsigned: >= SEED
            raise MalformedMessage("unknown share kind")
        return cls(rows["owner"].astype(np.uint64), kinds, rows["share"])


def params_digest(params: SessionParams) -> bytes:
    """SHA-256 of the canonical encoding of the session parameters (bound into every signature)."""
    w = Writer()
    params.write(w)
    digest = hashlib.sha256(b"fedsec/secagg/v1/params")
    digest.update(w.getvalue())  # no concatenated copy: a ring of 2^20 ids is 8 MB
    return digest.digest()


MESSAGE_TYPES = {cls.KIND: cls for cls in (SessionParams, AdvertiseKeys, KeyList, ShareKeys,
                                          ForwardedShares, MaskedInput, ConsistencyRequest,
                                          ConsistencySignature, UnmaskRequest, UnmaskResponse)}

Body = (SessionParams | AdvertiseKeys | KeyList | ShareKeys | MaskedInput | ConsistencyRequest
        | ConsistencySignature | UnmaskRequest | UnmaskResponse)


def encode(header: Header, body: Body) -> bytes:
    """Header and body as bytes."""
    w = Writer().fixed(MAGIC, 4).u8(body.KIND).fixed(header.session, SESSION_BYTES)
    w.u64(header.round).u64(header.sender).u64(header.recipient)
    body.write(w)
    return w.getvalue()


def decode(data: bytes, *, expect: type, session: bytes | None = None, round_index: int | None = None,
           sender: int | None = None, recipient: int | None = None) -> tuple[Header, Body]:
    """Parse ``data`` as a message of type ``expect`` and check its header.

    Raises:
        MalformedMessage: bad bytes, another kind, or a header (session, round, sender,
            recipient) other than the one given, e.g. a replay from another session or round.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedMessage("a message must be bytes")
    r = Reader(data)
    if r.fixed(4) != MAGIC:
        raise MalformedMessage("bad magic")
    kind = r.u8()
    if kind != expect.KIND:
        raise MalformedMessage(f"expected message kind {expect.KIND}, got {kind}")
    header = Header(kind, r.fixed(SESSION_BYTES), r.u64(), r.u64(), r.u64())
    for name, want, got in (("session", session, header.session), ("round", round_index, header.round),
                            ("sender", sender, header.sender), ("recipient", recipient, header.recipient)):
        if want is not None and want != got:
            raise MalformedMessage(f"message for another {name}")
    body = expect.read(r)
    r.end()
    return header, body
