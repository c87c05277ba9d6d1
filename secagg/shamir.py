"""Shamir t-of-n secret sharing of 32-byte secrets over the prime field GF(2^256 + 297).

One field element holds a whole 32-byte secret (no sub-secrets). Sharing evaluates all random
polynomials at all x-coordinates at once (numpy object arrays, Horner's rule). Reconstruction
uses exactly ``t`` shares with Lagrange coefficients at zero computed once per set of
x-coordinates (cached) in closed form: for a set S = {1..L} minus a set M of missing points,

    lambda_j = L! / prod(M) / j * (-1)^(j-1) / ((j-1)! (L-j)!) * prod_{m in M} (m - j),

which costs O(t |M|) multiplications instead of O(t^2). Protocols therefore number shares by
small positive x-coordinates (a client's ring offset to its neighbour) and reconstruct from the
smallest ones that answered, which keeps |M| small.

:func:`combine_one`, which a server calls once per secret with a different set of points each
time, uses the same closed form without reducing each coefficient: lambda_j times prod(M) is the
integer (-1)^(j-1) C(L, j) prod_{m in M} (m - j), so the secret is one exact sum of those integers
times the shares, reduced once and multiplied by the inverse of prod(M) (one modular inversion per
secret instead of one per point; the signed binomial rows are kept per L).
"""

from __future__ import annotations

import secrets as _secrets
from collections.abc import Sequence
from functools import lru_cache
from itertools import repeat
from operator import mul

import numpy as np
from fedsec.secagg.errors import InvalidArgumentError, ReconstructionError

PRIME = 2**256 + 297
"""The field modulus: the smallest prime above 2^256, so any 32-byte string is one element."""
SECRET_BYTES = 32
SHARE_BYTES = 33
MAX_X = 1 << 20
"""Largest x-coordinate accepted (the factorial tables grow with it)."""


def secret_to_int(secret: bytes) -> int:
    if len(secret) != SECRET_BYTES:
        raise InvalidArgumentError(f"secrets must be {SECRET_BYTES} bytes, got {len(secret)}")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes:
    if not 0 <= value < 2 ** (8 * SECRET_BYTES):
        raise ReconstructionError("reconstructed value is not a 32-byte secret")
    return value.to_bytes(SECRET_BYTES, "big")


def share_to_bytes(value: int) -> bytes:
    return value.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    value = int.from_bytes(data, "big")
    if len(data) != SHARE_BYTES or value >= PRIME:
        raise ReconstructionError("a share is not a field element")
    return value


def split(secrets: Sequence[bytes], *, threshold: int, xs: Sequence[int]) -> np.ndarray:
    """Share each secret t-of-len(xs).

    Args:
        secrets: 32-byte secrets.
        threshold: t, 1 <= t <= len(xs): any t shares reconstruct, t - 1 reveal nothing.
        xs: distinct x-coordinates in [1, MAX_X], one per share holder.

    Returns:
        An object array of Python ints, shape (len(secrets), len(xs)): share of secret i at xs[j].
    """
    points = _check_xs(xs)
    if not 1 <= threshold <= len(points):
        raise InvalidArgumentError(f"threshold must be in [1, {len(points)}], got {threshold}")
    values = [secret_to_int(s) for s in secrets]
    x = np.array(points, dtype=object)
    coefficients = [[_secrets.randbelow(PRIME) for _ in range(threshold - 1)] for _ in values]
    acc = np.zeros((len(values), len(points)), dtype=object)
    for degree in range(threshold - 2, -1, -1):
        column = np.array([c[degree] for c in coefficients], dtype=object)[:, None]
        acc = (acc * x + column) % PRIME
    constant = np.array(values, dtype=object)[:, None]
    return (acc * x + constant) % PRIME


def combine(xs: Sequence[int], shares: np.ndarray) -> list[bytes]:
    """Reconstruct secrets from exactly t shares each, all at the same x-coordinates.

    Args:
        xs: the t distinct x-coordinates of the shares used.
        shares: object array (n_secrets, t) of field elements, column j at xs[j].

    Raises:
        ReconstructionError: a share that is not an integer in [0, PRIME), or a result that is
            not a 32-byte secret (>= 2^256: shares that were never of one secret).
    """
    points = _check_xs(xs)
    if not isinstance(shares, np.ndarray) or shares.ndim != 2 or shares.shape[1] != len(points):
        raise ReconstructionError(f"need shares shaped (secrets, {len(points)}), got "
                                  f"{getattr(shares, 'shape', None)}")
    if shares.size and not all(isinstance(v, int | np.integer) and 0 <= v < PRIME for v in shares.flat):
        raise ReconstructionError("a share is not a field element")
    weights = np.array(lagrange_at_zero(tuple(points)), dtype=object)
    totals = (shares * weights).sum(axis=1) % PRIME if shares.size else []
    return [int_to_secret(int(v)) for v in totals]


def combine_one(xs: tuple[int, ...], shares: Sequence[bytes]) -> bytes:
    """Reconstruct one secret from exactly t serialized shares at the distinct x-coordinates ``xs``.

    Raises ReconstructionError for a share that is not 33 bytes of a field element or a result
    that is not a 32-byte secret; never anything else for any bytes."""
    points = _check_xs(xs)
    if len(shares) != len(points):
        raise ReconstructionError(f"need {len(points)} shares, got {len(shares)}")
    values = list(map(int.from_bytes, shares, repeat("big")))
    if any(len(s) != SHARE_BYTES for s in shares) or max(values) >= PRIME:
        raise ReconstructionError("a share is not a field element")
    top = max(points)
    if top > _EXACT_TOP:
        weights = lagrange_at_zero(tuple(points))
        return int_to_secret(sum(map(mul, weights, values)) % PRIME)
    row = _signed_binomials(top)
    coefficients = [row[x - 1] for x in points]
    if len(points) == top:  # x = 1..L, nothing missing
        return int_to_secret(sum(map(mul, coefficients, values)) % PRIME)
    present = set(points)
    missing = [j for j in range(1, top + 1) if j not in present]
    if len(missing) * top.bit_length() <= 62:  # every product over M fits in an int64
        factors = np.subtract.outer(np.array(missing, dtype=np.int64), np.array(points, dtype=np.int64))
        coefficients = list(map(mul, coefficients, factors.prod(axis=0).tolist()))
    else:
        for j in missing:
            coefficients = [c * (j - x) % PRIME for c, x in zip(coefficients, points, strict=True)]
    total = sum(map(mul, coefficients, values)) % PRIME
    return int_to_secret(total * pow(_prod_mod(missing), -1, PRIME) % PRIME)


_EXACT_TOP = 512
"""Largest x-coordinate for the exact-integer path of :func:`combine_one` (rows of at most 512
integers below 2^512 are kept); beyond it the reduced coefficients of :func:`lagrange_at_zero`."""


@lru_cache(maxsize=256)
def _signed_binomials(top: int) -> tuple[int, ...]:
    """(-1)^(j-1) C(top, j) for j = 1..top (exact integers): the Lagrange coefficients at zero of
    the points 1..top."""
    row, value = [], 1
    for j in range(1, top + 1):
        value = value * (top - j + 1) // j
        row.append(value if j % 2 else -value)
    return tuple(row)


def _check_xs(xs: Sequence[int]) -> list[int]:
    points = [int(x) for x in xs]
    if not points:
        raise InvalidArgumentError("need at least one x-coordinate")
    if len(set(points)) != len(points):
        raise ReconstructionError("x-coordinates must be distinct")
    if min(points) < 1 or max(points) > MAX_X:
        raise InvalidArgumentError(f"x-coordinates must lie in [1, {MAX_X}]")
    return points


@lru_cache(maxsize=4096)
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients lambda_j with f(0) = sum_j lambda_j f(x_j), for distinct xs >= 1."""
    points = sorted(xs)
    top = points[-1]
    present = set(points)
    missing = [m for m in range(1, top + 1) if m not in present]
    fact, inv_fact = _factorials(top)
    common = fact[top] * pow(_prod_mod(missing), -1, PRIME) % PRIME
    by_x = {}
    for j in points:
        value = common * pow(j, -1, PRIME) % PRIME * inv_fact[j - 1] % PRIME * inv_fact[top - j]
        for m in missing:
            value = value * (m - j) % PRIME
        by_x[j] = value if (j - 1) % 2 == 0 else (-value) % PRIME
    return tuple(by_x[x] for x in xs)


def _prod_mod(values: Sequence[int]) -> int:
    result = 1
    for v in values:
        result = result * v % PRIME
    return result


_FACT: list[int] = [1]
_INV_FACT: list[int] = [1]


def _factorials(n: int) -> tuple[list[int], list[int]]:
    """Factorials and inverse factorials mod PRIME up to n (grown on demand, kept)."""
    if len(_FACT) <= n:
        start = len(_FACT)
        for i in range(start, n + 1):
            _FACT.append(_FACT[-1] * i % PRIME)
        inv = pow(_FACT[n], -1, PRIME)
        extra = [0] * (n + 1 - start)
        for i in range(n, start - 1, -1):
            extra[i - start] = inv
            inv = inv * i % PRIME
        _INV_FACT.extend(extra)
    return _FACT, _INV_FACT
