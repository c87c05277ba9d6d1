"""Fast encryption randomness: Damgård-Jurik-Nielsen short exponents over a fixed-base table.

Plain Paillier draws r in Z_n^* and pays r^n mod n^2, a full exponentiation, per ciphertext. DJN
(PKC 2001, section 4.1 of the journal version) publishes h_s = h^n mod n^2 for h = -x^2 mod n and
uses h_s^a with a fresh a of ceil(k / 2) bits: h_s^a = (h^a)^n is still an n-th residue, so
c = (1 + n)^m h_s^a decrypts as usual, and hiding rests on DCR plus the short-exponent assumption
DJN state. Because the base is fixed, h_s^(d 2^(8i)) for every byte value d and byte position i
is tabulated once; each draw is then one modular multiplication per exponent byte (128 for a
2048-bit key), about 1 ms instead of 14 ms.

Every :class:`DJNRandomness` picks its own secret x, so no party (the key holder included) chooses
the base a client's ciphertexts hide under; exponents come from ``os.urandom`` and are never
reused.
"""

from __future__ import annotations

import os
import secrets

import gmpy2
from fedsec.secagg.paillier.keys import PaillierPublicKey


class DJNRandomness:
    """A source of fresh n-th residues mod n^2 for one public key.

    Args:
        public_key: the key the randomness is for.

    Building the table costs 255 x ceil(k / 16) modular multiplications (0.2 s for a 2048-bit key)
    and ~17 MB; keep one instance per key and reuse it across rounds.
    """

    def __init__(self, public_key: PaillierPublicKey) -> None:
        n, n_square = gmpy2.mpz(public_key.n), public_key.n_square
        x = gmpy2.mpz(0)
        while gmpy2.gcd(x, n) != 1:
            x = gmpy2.mpz(secrets.randbelow(public_key.n))
        h = n - x * x % n
        h_s = gmpy2.powmod(h, n, n_square)
        self.public_key = public_key
        self._root = h
        self.exponent_bytes = (public_key.key_bits // 2 + 7) // 8
        self._n_square = n_square
        self._table: list[list[gmpy2.mpz]] = []
        base = h_s
        for _ in range(self.exponent_bytes):
            row = [gmpy2.mpz(1), base]
            for _ in range(254):
                row.append(row[-1] * base % n_square)
            self._table.append(row)
            base = row[-1] * base % n_square  # base^256
        self.drawn = 0

    def root(self) -> gmpy2.mpz:
        """h, the n-th root of the base h_s (a proof of plaintext knowledge needs h^a mod n)."""
        return self._root

    def draw(self, count: int) -> list[gmpy2.mpz]:
        """``count`` fresh values h_s^a mod n^2, each from its own exponent a (ceil(k/2) bits)."""
        return self.draw_with_exponents(count)[0]

    def draw_with_exponents(self, count: int) -> tuple[list[gmpy2.mpz], list[int]]:
        """Like :meth:`draw`, also returning each exponent a (the witness of a knowledge proof)."""
        exponents = os.urandom(count * self.exponent_bytes)
        table, n_square, width = self._table, self._n_square, self.exponent_bytes
        out = []
        for start in range(0, count * width, width):
            acc = gmpy2.mpz(1)
            for row, digit in zip(table, exponents[start : start + width], strict=True):
                if digit:
                    acc = acc * row[digit] % n_square
            out.append(acc)
        self.drawn += count
        return out, [int.from_bytes(exponents[start : start + width], "little")
                     for start in range(0, count * width, width)]
