"""Verifiable decryption shares: public verification keys and a batched proof of equal logs.

The dealer publishes v, a random square of Z*_{n^2}, and v_i = v^(x_i) for each party i, where
x_i = D s_i is the exponent behind party i's decryption shares sigma_k = c_k^(2 x_i)
(:mod:`secagg.paillier.threshold`). With a safe-prime modulus (:mod:`secagg.paillier.safe_keys`)
the squares form a cyclic group Q of order n p' q', every prime factor of which is far above 2^128.

Proof for one request of K ciphertexts (Fiat-Shamir, statistical zero knowledge over the integers):

    rho_k   = 128-bit coefficients from H(context, i, v, v_i, every c_k, every sigma_k)
    C = (prod c_k^rho_k)^4,   S = (prod sigma_k^rho_k)^2              (both in Q)
    prover: r uniform in [0, 2^(|x| + 256)),  a = v^r,  b = C^r,
            e = H(context, i, v, v_i, C, S, a, b) (128 bits),  z = r + e x_i  (an integer)
    verifier: a' = v^z v_i^-e,  b' = C^z S^-e,  accept iff e = H(..., a', b') and z in range.

Soundness (Shoup 2000, section 4; Damgard-Jurik 2001): two accepting answers to one commitment
give log_v v_i = log_C S in Q, since e - e' is below every prime factor of |Q|; so
S = C^(x_i), and then every sigma_k^2 = c_k^(4 x_i) unless the 128-bit rho (fixed by the shares
themselves) happen to cancel a difference, probability 2^-128 per hash query. Zero knowledge: z
is within statistical distance 2^-128 of uniform given e x_i. The proof costs the prover two
multi-exponentiations with 128-bit exponents over the K values and two exponentiations, and is
e (16 bytes) plus z (about |x_i| + 256 bits).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import gmpy2
from fedsec.secagg.errors import CryptoError, InvalidArgumentError
from fedsec.secagg.paillier.keys import PaillierPublicKey
from fedsec.secagg.paillier.threshold import KeyShare, share_exponent_bits
from fedsec.secagg.paillier.transcript import (
    CHALLENGE_BITS,
    STATISTICAL_BITS,
    challenge,
    coefficients,
    int_bytes,
    multi_exp,
    values_digest,
)

_DOMAIN = b"fedsec/paillier/decryption-share-proof/v1"


@dataclass(frozen=True)
class VerificationKeys:
    """The dealer's public verification keys: v and v_i = v^(D s_i) mod n^2 for i = 1..N.

    Args:
        base: v, a square of Z*_{n^2}.
        keys: (v_1, ..., v_N), one per party in share-index order.
    """

    base: int
    keys: tuple[int, ...]

    def check(self, public_key: PaillierPublicKey, *, parties: int) -> None:
        """ValueError unless there are ``parties`` keys and every value is a unit of Z*_{n^2}."""
        n_square = public_key.n_square
        if len(self.keys) != parties:
            raise InvalidArgumentError(f"expected {parties} verification keys, got {len(self.keys)}")
        for value in (self.base, *self.keys):
            if not 0 < value < n_square or gmpy2.gcd(value, public_key.n) != 1:
                raise InvalidArgumentError("a verification key is not a unit mod n^2")


def make_verification_keys(shares: Sequence[KeyShare]) -> VerificationKeys:
    """The dealer's keys for ``shares`` (all N of them, in index order); v is drawn by the OS CSPRNG."""
    public_key = shares[0].public_key
    n, n_square = gmpy2.mpz(public_key.n), public_key.n_square
    r = gmpy2.mpz(0)
    while gmpy2.gcd(r, n) != 1:
        r = gmpy2.mpz(secrets.randbelow(int(n_square)))
    v = r * r % n_square
    return VerificationKeys(int(v), tuple(int(gmpy2.powmod(v, s.exponent, n_square)) for s in shares))


def _batch(public_key: PaillierPublicKey, context: bytes, index: int, v: int, v_i: int,
           ciphertexts: Sequence[int], shares: Sequence[int]) -> tuple[gmpy2.mpz, gmpy2.mpz, bytes]:
    n_square, width = public_key.n_square, public_key.ciphertext_bytes
    head = context + int_bytes(index) + int_bytes(v) + int_bytes(v_i)
    seed = head + values_digest(ciphertexts, width) + values_digest(shares, width)
    rho = coefficients(_DOMAIN, seed, len(ciphertexts))
    c = gmpy2.powmod(multi_exp(ciphertexts, rho, n_square), 4, n_square)
    s = gmpy2.powmod(multi_exp(shares, rho, n_square), 2, n_square)
    return c, s, head


def prove_decryption(share: KeyShare, keys: VerificationKeys, ciphertexts: Sequence[int],
                     shares: Sequence[int], context: bytes) -> bytes:
    """Party ``share.index``'s proof that ``shares`` are c^(2 x_i) for ``ciphertexts``.

    Args:
        context: the statement's binding (aggregation, contributor list): hashed into rho and e.
    Returns:
        e (16 bytes) followed by z (big-endian, its own length).
    """
    public_key = share.public_key
    n_square = public_key.n_square
    x = share.exponent
    v, v_i = keys.base, keys.keys[share.index - 1]
    c, s, head = _batch(public_key, context, share.index, v, v_i, ciphertexts, shares)
    bits = share_exponent_bits(key_bits=public_key.key_bits, parties=share.parties,
                               threshold=share.threshold)
    r = secrets.randbits(bits + CHALLENGE_BITS + STATISTICAL_BITS)
    a, b = gmpy2.powmod(v, r, n_square), gmpy2.powmod(c, r, n_square)
    e = challenge(_DOMAIN, head, int_bytes(c), int_bytes(s), int_bytes(a), int_bytes(b))
    z = r + e * x
    return e.to_bytes(CHALLENGE_BITS // 8, "big") + z.to_bytes((z.bit_length() + 7) // 8, "big")


def verify_decryption(public_key: PaillierPublicKey, keys: VerificationKeys, index: int,
                      ciphertexts: Sequence[int], shares: Sequence[int], context: bytes, proof: bytes,
                      *, parties: int, threshold: int) -> None:
    """Raises the opaque CryptoError unless ``proof`` shows party ``index``'s ``shares`` are right.

    ``ciphertexts`` and ``shares`` must already be validated units of Z*_{n^2}, equal in number.
    """
    if not 1 <= index <= len(keys.keys) or len(ciphertexts) != len(shares) or not ciphertexts:
        raise CryptoError()
    width = CHALLENGE_BITS // 8
    bits = share_exponent_bits(key_bits=public_key.key_bits, parties=parties, threshold=threshold)
    z_bytes = proof[width:]
    if len(proof) <= width or len(z_bytes) > (bits + CHALLENGE_BITS + STATISTICAL_BITS + 8) // 8 + 1:
        raise CryptoError()
    e, z = int.from_bytes(proof[:width], "big"), int.from_bytes(z_bytes, "big")
    n_square = public_key.n_square
    v, v_i = keys.base, keys.keys[index - 1]
    c, s, head = _batch(public_key, context, index, v, v_i, ciphertexts, shares)
    a = gmpy2.powmod(v, z, n_square) * gmpy2.powmod(v_i, -e, n_square) % n_square
    b = gmpy2.powmod(c, z, n_square) * gmpy2.powmod(s, -e, n_square) % n_square
    if challenge(_DOMAIN, head, int_bytes(c), int_bytes(s), int_bytes(a), int_bytes(b)) != e:
        raise CryptoError()
