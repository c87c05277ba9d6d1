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
import phe

from secagg.errors import InvalidArgumentError
from secagg.paillier.keys import SECURE_KEY_BITS, TEST_KEY_BITS, PaillierPrivateKey, PaillierPublicKey

_SIEVE = [p for p in range(3, 2000) if gmpy2.is_prime(p)]


def safe_prime(bits: int) -> gmpy2.mpz:
    """A uniformly drawn safe prime p = 2 p' + 1 of exactly ``bits`` bits, its top two bits set.

    Candidates p' come from the system CSPRNG; both p' and p are sieved by the primes below 2000,
    then tested with 25 Miller-Rabin rounds each (gmpy2).
    """
    if bits < 16:
        raise InvalidArgumentError(f"a safe prime needs at least 16 bits, got {bits}")
    top = (1 << (bits - 2)) | (1 << (bits - 3))
    while True:
        half = gmpy2.mpz(secrets.randbits(bits - 1) | top | 1)
        if any(half % p in (0, (p - 1) // 2) for p in _SIEVE):
            continue
        if gmpy2.is_prime(half, 25) and gmpy2.is_prime(2 * half + 1, 25):
            return 2 * half + 1


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
