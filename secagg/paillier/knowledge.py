"""Proof of plaintext knowledge for a batch of Paillier ciphertexts (Fiat-Shamir, batched).

A client that encrypts c_k = (1 + n)^(m_k) h_s^(a_k) (DJN randomness, h_s = h^n) shows it knows
every m_k, bound to a context (its identity, the aggregation, its batch), so it cannot submit a
function of someone else's ciphertext such as c_v^-1 Enc(x): knowing the plaintext of that would
mean knowing m_v.

    rho_k = 128-bit coefficients from H(context, every c_k)
    C = prod c_k^rho_k = (1 + n)^M R^n,  M = sum rho_k m_k mod n,  R = h^(sum rho_k a_k) mod n
    prover: alpha uniform in Z_n, beta uniform in Z*_n, T = (1 + alpha n) beta^n mod n^2,
            e = H(context, T) (128 bits), z_m = alpha + e M mod n, z_r = beta R^e mod n
    verifier: T' = (1 + z_m n) z_r^n C^-e mod n^2, accept iff e = H(context, T').

Soundness holds for any modulus whose prime factors exceed 2^128 (Damgard-Jurik 2001, section
8.1): from two answers (e, z), (e', z') to one T, gcd(e - e', n) = 1 gives u, w with
u (e - e') + w n = 1 and C = (1 + n)^(u (z_m - z_m')) ((z_r / z_r')^u C^w)^n, the plaintext of C;
over K choices of rho (fixed by the ciphertexts themselves) that is every m_k. The proof is
perfectly zero knowledge in the random-oracle model (simulate z first, then T). The prover pays
one exponentiation mod n and one mod n^2 (no per-ciphertext work beyond hashing and integer sums);
the verifier one 128-bit multi-exponentiation over the K ciphertexts and one exponentiation.
Size: 16 + 2 (key_bits / 8) bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import gmpy2
from fedsec.secagg.errors import CryptoError, InvalidCiphertextError
from fedsec.secagg.paillier.keys import PaillierPublicKey
from fedsec.secagg.paillier.randomness import DJNRandomness
from fedsec.secagg.paillier.transcript import (
    CHALLENGE_BITS,
    challenge,
    coefficients,
    int_bytes,
    multi_exp,
    values_digest,
)

_DOMAIN = b"fedsec/paillier/plaintext-knowledge/v1"


def proof_bytes(public_key: PaillierPublicKey) -> int:
    """The fixed size of a proof under ``public_key``: e, z_m and z_r."""
    return CHALLENGE_BITS // 8 + 2 * (public_key.key_bits // 8)


def encrypt_with_witness(public_key: PaillierPublicKey, plaintexts: Sequence[int],
                         randomness: DJNRandomness) -> tuple[list[gmpy2.mpz], list[int]]:
    """Like :func:`secagg.paillier.encrypt`, also returning each ciphertext's DJN exponent a_k."""
    if randomness.public_key != public_key:
        raise InvalidCiphertextError("the randomness source belongs to another key")
    n, n_square = gmpy2.mpz(public_key.n), public_key.n_square
    for m in plaintexts:
        if not 0 <= m < public_key.n:
            raise InvalidCiphertextError("a plaintext lies outside [0, n)")
    masks, exponents = randomness.draw_with_exponents(len(plaintexts))
    ciphertexts = [(1 + gmpy2.mpz(m) * n) * r % n_square for m, r in zip(plaintexts, masks, strict=True)]
    return ciphertexts, exponents


def _seed(public_key: PaillierPublicKey, context: bytes, ciphertexts: Sequence[int]) -> bytes:
    return context + values_digest(ciphertexts, public_key.ciphertext_bytes)


def prove_knowledge(public_key: PaillierPublicKey, randomness: DJNRandomness, ciphertexts: Sequence[int],
                    plaintexts: Sequence[int], exponents: Sequence[int], context: bytes) -> bytes:
    """The proof that the caller knows the plaintexts of ``ciphertexts`` (made by
    :func:`encrypt_with_witness` with ``randomness``), bound to ``context``."""
    n = gmpy2.mpz(public_key.n)
    n_square = public_key.n_square
    seed = _seed(public_key, context, ciphertexts)
    rho = coefficients(_DOMAIN, seed, len(ciphertexts))
    total_m = sum(r * int(m) for r, m in zip(rho, plaintexts, strict=True)) % n
    total_a = sum(r * a for r, a in zip(rho, exponents, strict=True))
    root = gmpy2.powmod(randomness.root(), total_a, n)
    alpha = secrets.randbelow(int(n))
    beta = gmpy2.mpz(0)
    while gmpy2.gcd(beta, n) != 1:
        beta = gmpy2.mpz(secrets.randbelow(int(n)))
    t = (1 + alpha * n) * gmpy2.powmod(beta, n, n_square) % n_square
    e = challenge(_DOMAIN, seed, int_bytes(t))
    z_m = (alpha + e * total_m) % n
    z_r = beta * gmpy2.powmod(root, e, n) % n
    width = public_key.key_bits // 8
    return e.to_bytes(CHALLENGE_BITS // 8, "big") + int(z_m).to_bytes(width, "big") + int(
        z_r).to_bytes(width, "big")


def verify_knowledge(public_key: PaillierPublicKey, ciphertexts: Sequence[int], context: bytes,
                     proof: bytes) -> None:
    """Raises the opaque CryptoError unless ``proof`` is a valid proof of knowledge of the
    plaintexts of ``ciphertexts`` (validated units of Z*_{n^2}) bound to ``context``."""
    if len(proof) != proof_bytes(public_key) or not ciphertexts:
        raise CryptoError()
    width, head = public_key.key_bits // 8, CHALLENGE_BITS // 8
    e = int.from_bytes(proof[:head], "big")
    z_m = gmpy2.mpz(int.from_bytes(proof[head : head + width], "big"))
    z_r = gmpy2.mpz(int.from_bytes(proof[head + width :], "big"))
    n = gmpy2.mpz(public_key.n)
    if z_m >= n or not 0 < z_r < n or gmpy2.gcd(z_r, n) != 1:
        raise CryptoError()
    n_square = public_key.n_square
    seed = _seed(public_key, context, ciphertexts)
    rho = coefficients(_DOMAIN, seed, len(ciphertexts))
    c = multi_exp(ciphertexts, rho, n_square)
    t = (1 + z_m * n) * gmpy2.powmod(z_r, n, n_square) * gmpy2.powmod(c, -e, n_square) % n_square
    if challenge(_DOMAIN, seed, int_bytes(t)) != e:
        raise CryptoError()
