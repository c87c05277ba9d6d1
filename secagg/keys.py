"""Safe recipes over ``cryptography``: X25519 agreement, HKDF, AES-GCM, Ed25519.

Keys travel as raw 32-byte strings. Every failure (a malformed key, a ciphertext or signature
that does not verify) raises the one opaque :class:`secagg.errors.CryptoError`.

An X25519 public key is accepted only in its canonical encoding (little-endian u < 2^255 - 19,
top bit clear) and only if it is not one of the points of small order (order 1, 2, 4 or 8 on
the curve or its twist, u in {0, 1, p - 1} and the two order-8 u-coordinates). With a small-order
peer key the shared secret takes at most 8 values whatever the private key (all-zero for a
clamped scalar), so a peer or a server that advertised one would fix the keys derived from it.
Canonical encodings also make equal byte strings equal points, so duplicate-key checks on bytes
cannot be evaded by a second encoding of the same key.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from fedsec.secagg.errors import CryptoError, InvalidArgumentError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SIGNATURE_BYTES = 64
_RAW = serialization.Encoding.Raw
_RAW_PUBLIC = serialization.PublicFormat.Raw
_RAW_PRIVATE = serialization.PrivateFormat.Raw
_NO_ENCRYPTION = serialization.NoEncryption()

FIELD_PRIME = 2**255 - 19
"""The prime of Curve25519's base field."""
SMALL_ORDER_U = frozenset({
    0,
    1,
    FIELD_PRIME - 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
})
"""Canonical u-coordinates of every point of order dividing 8 on Curve25519 and its twist."""


def check_public_key(public: bytes) -> None:
    """Refuse an X25519 public key that is not 32 bytes, not canonical, or of small order.

    Raises:
        CryptoError: (opaque) for any of those; an honest key generated here always passes.
    """
    if not isinstance(public, bytes | bytearray) or len(public) != KEY_BYTES:
        raise CryptoError()
    u = int.from_bytes(public, "little")
    if u >= FIELD_PRIME or u in SMALL_ORDER_U:
        raise CryptoError()


class KeyPair:
    """An X25519 key pair; ``private`` (raw bytes) never leaves its owner except as Shamir shares."""

    __slots__ = ("_key", "public")

    def __init__(self, key: X25519PrivateKey) -> None:
        self._key = key
        self.public: bytes = key.public_key().public_bytes(_RAW, _RAW_PUBLIC)

    @classmethod
    def generate(cls) -> KeyPair:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private(cls, private: bytes) -> KeyPair:
        """Rebuild a key pair from its raw private key (e.g. reconstructed from shares)."""
        try:
            return cls(X25519PrivateKey.from_private_bytes(private))
        except ValueError:
            raise CryptoError() from None

    @property
    def private(self) -> bytes:
        return self._key.private_bytes(_RAW, _RAW_PRIVATE, _NO_ENCRYPTION)

    def agree(self, peer_public: bytes) -> bytes:
        """Raw X25519 shared secret with ``peer_public``; CryptoError for a non-canonical or
        small-order peer key (:func:`check_public_key`) and for an all-zero secret."""
        check_public_key(peer_public)
        try:
            secret = self._key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError:
            raise CryptoError() from None
        if secret == bytes(KEY_BYTES):
            raise CryptoError()
        return secret


def derive_key(secret: bytes, *, purpose: bytes, context: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``secret`` bound to a purpose label and a context (session, round, parties)."""
    info = b"fedsec/secagg/v1/" + purpose + b"\x00" + context
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def context_bytes(session: bytes, round_index: int, *parties: int) -> bytes:
    """Canonical context: session id, round and party ids, length-prefixed and fixed-width.

    At most 65,535 parties (a 16-bit count); more is an :class:`InvalidArgumentError`, never a
    ``struct.error``. Longer lists (a survivor list) need their own statement with a wider count.
    """
    if len(session) > 0xFFFF or len(parties) > 0xFFFF:
        raise InvalidArgumentError("a key-derivation context names at most 65,535 parties")
    return struct.pack(">H", len(session)) + session + struct.pack(
        f">QH{len(parties)}Q", round_index, len(parties), *parties)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM with a random 96-bit nonce: nonce || ciphertext || tag."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def open_sealed(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    """Inverse of :func:`seal`; any tampering, wrong key or wrong associated data fails alike."""
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise CryptoError()
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except InvalidTag:
        raise CryptoError() from None


@dataclass(frozen=True)
class SigningKey:
    """A long-term Ed25519 identity key (active-adversary mode)."""

    private: bytes
    public: bytes

    @classmethod
    def generate(cls) -> SigningKey:
        key = Ed25519PrivateKey.generate()
        return cls(key.private_bytes(_RAW, _RAW_PRIVATE, _NO_ENCRYPTION),
                   key.public_key().public_bytes(_RAW, _RAW_PUBLIC))

    def sign(self, message: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.private).sign(message)


def verify(public: bytes, signature: bytes, message: bytes) -> None:
    """Check an Ed25519 signature; raises CryptoError if it does not verify."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        raise CryptoError() from None
