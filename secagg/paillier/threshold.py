"""Threshold decryption: the Paillier key split t-of-N, so that no t - 1 parties can decrypt.

A dealer (a one-time key ceremony that then forgets the key) shares d = lambda (lambda^-1 mod n),
for which c^d = 1 + m n mod n^2, with Shamir's scheme over the integers (no safe primes needed,
so ``phe``'s keys serve): with D = N!,

    f(x) = D d + a_1 x + ... + a_{t-1} x^{t-1},   a_j uniform in [0, D 2^(|d| + 128 + t)),
    party i holds s_i = f(i), i = 1..N.

Any t - 1 shares are within statistical distance t 2^-128 of shares of any other secret of the
same size (the difference is a polynomial D (d - d') prod_{i in C} (1 - x / i) with integer
coefficients below D 2^(|d| + t), each hidden by a coefficient 2^128 times wider).

A party's decryption share of c is c^(2 D s_i) mod n^2 (Shoup's factor 2: the combination
squares each share, so the four square roots of 1 a party could multiply in vanish). From any t
of them, with the integers mu_i = D prod_{j != i} j / (j - i),

    prod_i (c^(2 D s_i))^(2 mu_i) = c^(4 D^3 d) = 1 + 4 D^3 m n  (mod n^2),   m = L(.) (4 D^3)^-1 mod n.

Given m and t - 1 parties' shares, every other party's decryption share is determined up to a
square root of 1 (c^(2 D f(j)) = (1 + 2 D^2 m n)^(mu'_0) prod (c^(2 D s_i))^(mu'_i), integer
Lagrange coefficients mu' times D), so decryption shares of a ciphertext reveal its plaintext and
nothing more. Each share comes with a proof against the dealer's public verification keys
(:mod:`secagg.paillier.share_proofs`), so a party that lies is named, and the shares that verify
are exactly the honest values up to a square root of 1, which :func:`combine` removes.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import gmpy2
from fedsec.secagg.errors import InvalidArgumentError, ReconstructionError
from fedsec.secagg.paillier.keys import PaillierPrivateKey, PaillierPublicKey

STATISTICAL_SECURITY = 128
MAX_PARTIES = 1000


@dataclass(frozen=True)
class KeyShare:
    """Party ``index``'s share of the decryption key (secret: never logged, never sent but to it)."""

    index: int
    value: int = field(repr=False)
    """s_i = f(i); the secret exponent of the decryption shares is 2 D s_i."""
    parties: int
    threshold: int
    public_key: PaillierPublicKey = field(repr=False)

    @property
    def delta(self) -> int:
        return math.factorial(self.parties)

    @property
    def exponent(self) -> int:
        """x_i = D s_i: the discrete log of the verification key v_i to the base v."""
        return self.delta * self.value


def share_exponent_bits(*, key_bits: int, parties: int, threshold: int) -> int:
    """An upper bound on the bits of x_i = D s_i for any party of an honest dealing.

    s_i = f(i) < t N^(t-1) D 2^(|d| + 128 + t) with |d| <= 2 key_bits (d < n^2).
    """
    delta = math.factorial(parties)
    return ((threshold * parties ** (threshold - 1) * delta * delta).bit_length()
            + 2 * key_bits + STATISTICAL_SECURITY + threshold + 1)


def deal_shares(private_key: PaillierPrivateKey, *, parties: int, threshold: int) -> list[KeyShare]:
    """Split the key t-of-N; shares[i - 1] is party i's. The caller then drops ``private_key``.

    Args:
        parties: N, in [2, 1000].
        threshold: t, in [2, N]: any t shares decrypt, t - 1 learn nothing.
    """
    if not 2 <= parties <= MAX_PARTIES:
        raise InvalidArgumentError(f"parties must be in [2, {MAX_PARTIES}], got {parties}")
    if not 2 <= threshold <= parties:
        raise InvalidArgumentError(f"threshold must be in [2, {parties}], got {threshold}")
    d = private_key.decryption_exponent()
    delta = math.factorial(parties)
    bound = delta << (d.bit_length() + STATISTICAL_SECURITY + threshold)
    coefficients = [delta * d] + [secrets.randbelow(bound) for _ in range(threshold - 1)]
    shares = []
    for i in range(1, parties + 1):
        value = 0
        for a in reversed(coefficients):
            value = value * i + a
        shares.append(KeyShare(i, value, parties, threshold, private_key.public_key))
    return shares


def decryption_shares(share: KeyShare, ciphertexts: Sequence[int]) -> list[gmpy2.mpz]:
    """c^(2 D s_i) mod n^2 for each (validated) ciphertext c."""
    n_square = share.public_key.n_square
    exponent = gmpy2.mpz(2 * share.delta * share.value)
    return [gmpy2.powmod(c, exponent, n_square) for c in ciphertexts]


def _coefficients(indices: Sequence[int], delta: int) -> dict[int, int]:
    out = {}
    for i in indices:
        mu = Fraction(delta)
        for j in indices:
            if j != i:
                mu *= Fraction(j, j - i)
        if mu.denominator != 1:
            raise ReconstructionError("Lagrange coefficient is not an integer")
        out[i] = int(mu)
    return out


def combine(public_key: PaillierPublicKey, shares: Mapping[int, Sequence[int]], *, parties: int,
            threshold: int) -> list[int]:
    """The plaintexts from decryption shares of at least ``threshold`` distinct parties.

    Args:
        shares: party index (1..parties) -> its decryption shares, one per ciphertext, validated
            as units mod n^2. The ``threshold`` lowest indices are used.
    """
    indices = sorted(shares)[:threshold]
    if len(indices) < threshold or any(not 1 <= i <= parties for i in indices):
        raise ReconstructionError(f"need decryption shares of {threshold} distinct parties in "
                                  f"[1, {parties}], got {sorted(shares)}")
    lengths = {len(shares[i]) for i in indices}
    if len(lengths) != 1:
        raise ReconstructionError("decryption shares cover different numbers of ciphertexts")
    delta = math.factorial(parties)
    mu = _coefficients(indices, delta)
    n, n_square = gmpy2.mpz(public_key.n), public_key.n_square
    scale = gmpy2.invert(4 * gmpy2.mpz(delta) ** 3, n)
    out = []
    for k in range(lengths.pop()):
        acc = gmpy2.mpz(1)
        for i in indices:
            acc = acc * gmpy2.powmod(shares[i][k], 2 * mu[i], n_square) % n_square
        if acc % n != 1:
            raise ReconstructionError("decryption shares are inconsistent")
        out.append(int((acc - 1) // n * scale % n))
    return out
