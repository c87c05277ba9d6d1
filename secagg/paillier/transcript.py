"""Fiat-Shamir transcripts for the Paillier proofs: challenges and batching coefficients.

Every hash input is length-prefixed and starts with a domain string, so no two statements or
proof kinds share a transcript. Challenges and batching coefficients are 128 bits
(:data:`CHALLENGE_BITS`): below every prime factor of a valid modulus and of the group orders the
proofs work in, so two accepting transcripts with one commitment always differ invertibly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import gmpy2

CHALLENGE_BITS = 128
STATISTICAL_BITS = 128
"""Masking margin: a response z = r + e x hides x when r is 2^STATISTICAL_BITS times wider than e x."""


def int_bytes(value: int) -> bytes:
    """Length-prefixed big-endian bytes of a non-negative integer (a canonical hash input)."""
    value = int(value)
    raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return len(raw).to_bytes(4, "big") + raw


def values_digest(values: Sequence[int], width: int) -> bytes:
    """SHA-256 over ``values`` written as fixed ``width``-byte big-endian words."""
    h = hashlib.sha256(len(values).to_bytes(4, "big"))
    for v in values:
        h.update(int(v).to_bytes(width, "big"))
    return h.digest()


def challenge(domain: bytes, *parts: bytes) -> int:
    """A 128-bit challenge: SHA-256 over the domain and the length-prefixed parts, truncated."""
    h = hashlib.sha256(int_bytes(len(domain)) + domain)
    for part in parts:
        h.update(len(part).to_bytes(4, "big") + part)
    return int.from_bytes(h.digest()[: CHALLENGE_BITS // 8], "big")


def coefficients(domain: bytes, seed: bytes, count: int) -> list[int]:
    """``count`` 128-bit batching coefficients expanded (SHAKE-256) from a transcript ``seed``."""
    width = CHALLENGE_BITS // 8
    raw = hashlib.shake_256(domain + b"/" + seed).digest(width * count)
    return [int.from_bytes(raw[i : i + width], "big") for i in range(0, width * count, width)]


def multi_exp(bases: Sequence[int], exponents: Sequence[int], modulus: int) -> gmpy2.mpz:
    """prod bases[k]^exponents[k] mod ``modulus`` for exponents below 2^128 (bucket method).

    Pippenger with 8-bit windows: about 16 (K + 510) modular multiplications for K bases instead
    of about 192 K for K separate exponentiations; plain exponentiations below 64 bases.
    """
    m = gmpy2.mpz(modulus)
    if len(bases) < 64:
        acc = gmpy2.mpz(1)
        for b, e in zip(bases, exponents, strict=True):
            acc = acc * gmpy2.powmod(b, e, m) % m
        return acc
    width = CHALLENGE_BITS // 8
    digits = [int(e).to_bytes(width, "big") for e in exponents]
    if len(digits) != len(bases):
        raise ValueError("multi_exp: bases and exponents differ in number")
    result = gmpy2.mpz(1)
    for j in range(width):
        if result != 1:
            for _ in range(8):
                result = result * result % m
        buckets: list[gmpy2.mpz | None] = [None] * 256
        for b, d in zip(bases, digits, strict=True):
            digit = d[j]
            if digit:
                held = buckets[digit]
                buckets[digit] = b if held is None else held * b % m
        running, total = gmpy2.mpz(1), gmpy2.mpz(1)
        for digit in range(255, 0, -1):
            if buckets[digit] is not None:
                running = running * buckets[digit] % m
            if running != 1:
                total = total * running % m
        result = result * total % m
    return result
