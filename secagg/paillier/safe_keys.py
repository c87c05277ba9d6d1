"""Paillier keys from safe primes, for threshold custody's dealer.

n = p q with p = 2 p' + 1, q = 2 q' + 1 and p', q' prime. Then the squares of Z*_{n^2} form a
cyclic group of order n p' q' whose prime factors are all at least ``key_bits / 2 - 1`` bits, and
the only elements of small order in Z*_{n^2} are the four square roots of 1. The verifiable
decryption shares (:mod:`secagg.paillier.share_proofs`) need exactly this: their proofs work on
squares, where a 128-bit challenge is below every prime factor of the group order (Shoup 2000,
Damgard-Jurik 2001). ``phe``'s keys use ordinary primes and serve key-holder custody.
"""

from __future__ import annotations

import secrets

import gmpy2
import numpy as np
import phe
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.paillier.keys import SECURE_KEY_BITS, TEST_KEY_BITS, PaillierPrivateKey, PaillierPublicKey

_PRIMES = np.array([p for p in range(3, 1 << 16, 2) if gmpy2.is_prime(p)], dtype=np.int64)
_INVERSE_TWO = (_PRIMES + 1) // 2
_WINDOW = 1 << 16


def _survivors(start: int) -> np.ndarray:
    """Offsets j in [0, _WINDOW) for which neither p' = start + 2 j nor 2 p' + 1 has a factor
    below 2^16 (a vectorised sieve; ``start`` is odd)."""
    residues = np.array([start % int(p) for p in _PRIMES], dtype=np.int64)
    # p' = 0 (mod p) iff j = -start / 2; 2 p' + 1 = 0 iff p' = (p - 1) / 2 iff j = ((p - 1) / 2 - start) / 2
    first = (-residues * _INVERSE_TWO) % _PRIMES
    second = (((_PRIMES - 1) // 2 - residues) * _INVERSE_TWO) % _PRIMES
    keep = np.ones(_WINDOW, dtype=bool)
    for p, j0, j1 in zip(_PRIMES.tolist(), first.tolist(), second.tolist(), strict=True):
        keep[j0::p] = False
        keep[j1::p] = False
    return np.flatnonzero(keep)


def safe_prime(bits: int) -> gmpy2.mpz:
    """A safe prime p = 2 p' + 1 of exactly ``bits`` bits, its top two bits set.

    A random odd start p'_0 comes from the system CSPRNG; the window p'_0 + 2 j, j < 2^16, is
    sieved for p' and 2 p' + 1 by every odd prime below 2^16; survivors must pass a base-2 Fermat
    test on p, then 25 Miller-Rabin rounds on both (gmpy2). A new start is drawn if the window
    holds none.
    """
    if bits < 24:
        raise InvalidArgumentError(f"a safe prime needs at least 24 bits, got {bits}")
    top = (1 << (bits - 2)) | (1 << (bits - 3))
    while True:
        start = gmpy2.mpz(secrets.randbits(bits - 1) | top | 1)
        for j in _survivors(int(start)).tolist():
            half = start + 2 * j
            candidate = 2 * half + 1
            if candidate.bit_length() != bits:
                break
            if gmpy2.powmod(2, candidate - 1, candidate) != 1:
                continue
            if gmpy2.is_prime(half, 25) and gmpy2.is_prime(candidate, 25):
                return candidate


def generate_safe_keypair(key_bits: int = 2048, *, allow_insecure: bool = False
                          ) -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """A key pair whose modulus is a product of two distinct safe primes of ``key_bits / 2`` bits.

    Args:
        key_bits: 2048, 3072 or 4096 (512/1024 only with ``allow_insecure``, for tests).
    """
    allowed = SECURE_KEY_BITS + (TEST_KEY_BITS if allow_insecure else ())
    if key_bits not in allowed:
        raise InvalidArgumentError(f"key_bits must be one of {allowed}, got {key_bits}")
    p = safe_prime(key_bits // 2)
    q = p
    while q == p:
        q = safe_prime(key_bits // 2)
    public = phe.PaillierPublicKey(int(p * q))
    key = PaillierPublicKey(public.n)
    return key, PaillierPrivateKey(key, phe.PaillierPrivateKey(public, int(p), int(q)))
