"""Packed Paillier ciphertexts: encryption, a canonical batch format, validation, sum, decryption.

Batch format (big-endian): magic ``FSPB``, version (u8), key id (16 bytes), round (u64), count
(u32), width (u16, = ciphertext bytes of the key), then ``count`` ciphertexts of ``width`` bytes.
:func:`decode_batch` checks every field against what the receiver expects, then that each value
c satisfies 0 < c < n^2 and that all are units mod n (gcd(c, n) = 1, tested at once as
gcd(prod c mod n^2, n) = 1: a prime factor of n divides the product iff it divides some c). It
raises :class:`~secagg.errors.InvalidCiphertextError` before any arithmetic touches a sum.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import gmpy2
from fedsec.secagg.errors import InvalidCiphertextError
from fedsec.secagg.paillier.keys import KEY_ID_BYTES, PaillierPrivateKey, PaillierPublicKey
from fedsec.secagg.paillier.randomness import DJNRandomness

_MAGIC = b"FSPB"
_VERSION = 1
_HEADER = struct.Struct(f">4sB{KEY_ID_BYTES}sQIH")
MAX_BATCH = 1 << 22


def encrypt(public_key: PaillierPublicKey, plaintexts: Sequence[int], randomness: DJNRandomness
            ) -> list[gmpy2.mpz]:
    """c = (1 + m n) * h_s^a mod n^2 for each plaintext m in [0, n) (g = n + 1, so g^m = 1 + m n)."""
    if randomness.public_key != public_key:
        raise InvalidCiphertextError("the randomness source belongs to another key")
    n, n_square = gmpy2.mpz(public_key.n), public_key.n_square
    for m in plaintexts:
        if not 0 <= m < public_key.n:
            raise InvalidCiphertextError("a plaintext lies outside [0, n)")
    masks = randomness.draw(len(plaintexts))
    return [(1 + gmpy2.mpz(m) * n) * r % n_square for m, r in zip(plaintexts, masks, strict=True)]


def encode_batch(public_key: PaillierPublicKey, round_index: int, values: Sequence[int]) -> bytes:
    """The canonical bytes of ``values`` (ciphertexts under ``public_key``) for ``round_index``."""
    width = public_key.ciphertext_bytes
    header = _HEADER.pack(_MAGIC, _VERSION, public_key.key_id, round_index, len(values), width)
    return header + b"".join(int(v).to_bytes(width, "big") for v in values)


def decode_batch(data: bytes, public_key: PaillierPublicKey, *, round_index: int, count: int
                 ) -> list[gmpy2.mpz]:
    """Parse and validate a batch; every refusal raises InvalidCiphertextError."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < _HEADER.size:
        raise InvalidCiphertextError("not a ciphertext batch (too short)")
    magic, version, key_id, got_round, got_count, width = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise InvalidCiphertextError("not a ciphertext batch (magic or version)")
    if key_id != public_key.key_id:
        raise InvalidCiphertextError("the batch is under another key")
    if got_round != round_index:
        raise InvalidCiphertextError(f"the batch is for round {got_round}, expected {round_index}")
    if got_count != count or count > MAX_BATCH:
        raise InvalidCiphertextError(f"the batch holds {got_count} ciphertexts, expected {count}")
    if width != public_key.ciphertext_bytes or len(data) != _HEADER.size + count * width:
        raise InvalidCiphertextError("the batch has the wrong size")
    n_square = public_key.n_square
    view = memoryview(data)[_HEADER.size :]
    values, product = [], gmpy2.mpz(1)
    for start in range(0, count * width, width):
        c = gmpy2.mpz(int.from_bytes(view[start : start + width], "big"))
        if not 0 < c < n_square:
            raise InvalidCiphertextError("a ciphertext lies outside (0, n^2)")
        product = product * c % n_square
        values.append(c)
    if gmpy2.gcd(product, public_key.n) != 1:
        raise InvalidCiphertextError("a ciphertext is not a unit mod n")
    return values


def add_into(total: list[gmpy2.mpz], values: Sequence[gmpy2.mpz], public_key: PaillierPublicKey
             ) -> None:
    """total[i] <- total[i] * values[i] mod n^2 (adds the plaintexts), in place."""
    if len(total) != len(values):
        raise InvalidCiphertextError(f"cannot add {len(values)} ciphertexts to {len(total)}")
    n_square = public_key.n_square
    for i, c in enumerate(values):
        total[i] = total[i] * c % n_square


def decrypt(private_key: PaillierPrivateKey, values: Sequence[int]) -> list[int]:
    """The plaintexts of validated ciphertexts (CRT decryption, two half-size exponentiations each)."""
    return [private_key.decrypt(c) for c in values]
