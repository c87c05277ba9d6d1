"""Safe recipes over ``cryptography``: X25519 agreement, HKDF, AES-GCM, Ed25519.

Keys travel as raw 32-byte strings. Every failure (a malformed key, a ciphertext or signature
that does not verify) raises the one opaque :class:`secagg.errors.CryptoError`.
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

from secagg.errors import CryptoError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SIGNATURE_BYTES = 64
_RAW = serialization.Encoding.Raw
_RAW_PUBLIC = serialization.PublicFormat.Raw
_RAW_PRIVATE = serialization.PrivateFormat.Raw
_NO_ENCRYPTION = serialization.NoEncryption()


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
        """Raw X25519 shared secret with ``peer_public``."""
        try:
            return self._key.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:
            raise CryptoError() from None


def derive_key(secret: bytes, *, purpose: bytes, context: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``secret`` bound to a purpose label and a context (session, round, parties)."""
    info = b"fedsec/secagg/v1/" + purpose + b"\x00" + context
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def context_bytes(session: bytes, round_index: int, *parties: int) -> bytes:
    """Canonical context: session id, round and party ids, length-prefixed and fixed-width."""
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
