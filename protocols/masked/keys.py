"""Key derivation and signed statements of the masking protocol, each domain-separated.

Every derived key is HKDF-SHA256 of an X25519 secret (or the self-mask seed) bound to a purpose
label and the context (session, round, parties), so no key is ever reused across sessions,
rounds, pairs or purposes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
from fedsec.secagg import keys as crypto

COMMITMENT_BYTES = 32


def mask_key(own: crypto.KeyPair, peer_public: bytes, session: bytes, round_index: int, u: int,
             v: int) -> bytes:
    """AES key of the pairwise mask between clients u and v (symmetric in u, v)."""
    lo, hi = min(u, v), max(u, v)
    return crypto.derive_key(own.agree(peer_public), purpose=b"pairwise-mask",
                             context=crypto.context_bytes(session, round_index, lo, hi))


def self_mask_key(seed: bytes, session: bytes, round_index: int, owner: int) -> bytes:
    """AES key of client ``owner``'s self-mask, from its 32-byte seed."""
    return crypto.derive_key(seed, purpose=b"self-mask",
                             context=crypto.context_bytes(session, round_index, owner))


def share_box_key(own: crypto.KeyPair, peer_public: bytes, session: bytes, round_index: int,
                  sender: int, recipient: int) -> bytes:
    """AES-GCM key for share bundles between ``sender`` and ``recipient`` (either direction)."""
    lo, hi = min(sender, recipient), max(sender, recipient)
    return crypto.derive_key(own.agree(peer_public), purpose=b"share-encryption",
                             context=crypto.context_bytes(session, round_index, lo, hi))


def share_box_context(session: bytes, round_index: int, sender: int, recipient: int) -> bytes:
    """Associated data of a share bundle: session, round, sender and recipient, in that order."""
    return b"share-bundle" + crypto.context_bytes(session, round_index, sender, recipient)


def key_message(session: bytes, round_index: int, client: int, encryption_key: bytes,
                mask_public: bytes, commitment: bytes, *, params: bytes) -> bytes:
    """The statement a client signs when it advertises its keys and its share commitment.

    Every signed statement carries ``params``, the digest of the session parameters the signer
    was sent (:func:`protocols.masked.messages.params_digest`), so clients shown different rings,
    degrees or thresholds can never use each other's keys, lists or attestations."""
    context = crypto.context_bytes(session, round_index, client)
    return b"advertise-keys" + context + params + encryption_key + mask_public + commitment


def share_hash(session: bytes, round_index: int, owner: int, x: int, kind: int, share: bytes) -> bytes:
    """SHA-256 commitment to one serialized Shamir share (kind 0 = seed, 1 = mask key) at ``x``."""
    return hashlib.sha256(b"fedsec/secagg/v1/share" + crypto.context_bytes(
        session, round_index, owner, x, kind) + share).digest()


class ShareHasher:
    """:func:`share_hash` for the many shares of one (session, round) a server checks: each owner's
    prefix (label, session, round, owner) is built once."""

    _TAIL = struct.Struct(">QQ")

    def __init__(self, session: bytes, round_index: int) -> None:
        self.session, self.round_index = session, round_index
        self._prefixes: dict[int, bytes] = {}
        self._common: np.ndarray | None = None

    def digest(self, owner: int, x: int, kind: int, share: bytes) -> bytes:
        """Equal to ``share_hash(session, round_index, owner, x, kind, share)``."""
        prefix = self._prefixes.get(owner)
        if prefix is None:
            prefix = self._prefixes[owner] = b"fedsec/secagg/v1/share" + crypto.context_bytes(
                self.session, self.round_index, owner, 0, 0)[:-self._TAIL.size]
        return hashlib.sha256(prefix + self._TAIL.pack(x, kind) + share).digest()

    def digests(self, owners: Sequence[int], xs: Sequence[int], kinds: Sequence[int],
                shares: Sequence[bytes]) -> bytes:
        """The digests of many shares, concatenated (32 bytes each, in order)."""
        prefixes, tail, sha256, one = self._prefixes, self._TAIL.pack, hashlib.sha256, self.digest
        return b"".join([sha256(prefixes[o] + tail(x, k) + s).digest() if o in prefixes else one(o, x, k, s)
                         for o, x, k, s in zip(owners, xs, kinds, shares, strict=True)])


    def digest_rows(self, owners: np.ndarray, xs: np.ndarray, kinds: np.ndarray,
                    shares: np.ndarray) -> np.ndarray:
        """The digests of many shares as a (n, 32) uint8 array, row i equal to
        ``share_hash(session, round_index, owners[i], xs[i], kinds[i], shares[i].tobytes())``.

        Args:
            owners, xs, kinds: n non-negative integers each (< 2^64).
            shares: (n, SHARE_BYTES) uint8, the serialised shares.
        """
        n = len(owners)
        common = self._common
        if common is None:  # label, session, round, party count: the same for every share
            common = self._common = np.frombuffer(b"fedsec/secagg/v1/share" + crypto.context_bytes(
                self.session, self.round_index, 0, 0, 0)[:-24], dtype=np.uint8)
        width = common.size + 24 + shares.shape[1]
        rows = np.empty((n, width), dtype=np.uint8)
        rows[:, :common.size] = common
        at = common.size
        for column in (owners, xs, kinds):
            rows[:, at:at + 8] = np.asarray(column).astype(">u8").view(np.uint8).reshape(n, 8)
            at += 8
        rows[:, at:] = shares
        data, sha256 = memoryview(rows.tobytes()), hashlib.sha256
        digests = b"".join([sha256(data[i:i + width]).digest() for i in range(0, n * width, width)])
        return np.frombuffer(digests, dtype=np.uint8).reshape(n, COMMITMENT_BYTES)


def commitment_digest(hashes: bytes) -> bytes:
    """The 32-byte commitment bound into the signed key entry: SHA-256 of all share hashes."""
    return hashlib.sha256(b"fedsec/secagg/v1/share-commitments" + hashes).digest()


def attestation_message(session: bytes, round_index: int, client: int, partners: bytes, *,
                        params: bytes) -> bytes:
    """The statement a client signs with its masked input: the bitmap (by x-coordinate, bit
    x - 1 of byte (x - 1) // 8, least significant first) of the neighbours it masked with."""
    return b"masked-with" + crypto.context_bytes(session, round_index, client) + params + partners


def consistency_message(session: bytes, round_index: int, survivors: tuple[int, ...], *,
                        params: bytes) -> bytes:
    """The statement a client signs over the survivor list (active mode).

    The list is counted with 32 bits (lists of up to 2^20 ids, the wire's ring limit, and more),
    unlike :func:`secagg.keys.context_bytes`, whose party count is 16-bit."""
    ids = sorted(survivors)
    return (b"survivors/v2" + params + crypto.context_bytes(session, round_index)
            + struct.pack(f">I{len(ids)}Q", len(ids), *ids))
