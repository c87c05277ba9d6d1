"""F^T of one spectrum for any step count T, the same array whatever was asked before.

The running accountants (:mod:`dp.analysis.pld_running`, :mod:`dp.analysis.prv_running`) compose
T identical steps as the inverse FFT of F^T, F the real FFT of the one-step PMF. They used to
advance a running power from the previous round's (F^T' = F^T F^(T' - T), recomputed with
``numpy.power`` every 128 advances), so the last bits of F^T, and of the epsilon read from it,
depended on which step counts had been asked before: a resumed run, a sweep's second experiment
with the same (sigma, q) or a test after another could report an epsilon 1e-9 away from a fresh
process's. :class:`BinaryPowers` computes F^T by binary powering instead: the squarings
F^(2^i) are cached (computed once each, by repeated squaring), and F^T is their product over the
set bits of T, lowest bit first. Each of those arrays is a fixed sequence of elementwise complex
multiplications, so F^T is a function of (F, T) alone, bit for bit.

Cost: one multiplication per set bit of T (about log2(T) / 2 of them, N / 2 values each), against
one for the running power; the squarings once per grid (log2 T of them). Memory: up to log2(T)
arrays of the spectrum's size, at most :data:`CACHED_BYTES` (the squarings beyond are recomputed
at each call, by the same operations).

Rounding (first order in the unit roundoff): with eta the relative error of one complex
multiplication, the computed square F^(2^i) is within (2^i - 1) eta relative of the exact power
of the computed F (each squaring doubles the relative error it receives and adds eta), and their
product over the set bits of T within sum (2^i - 1) eta + (popcount(T) - 1) eta = (T - 1) eta.
:func:`multiplications_error` states it for the callers' rounding bounds.
"""

from __future__ import annotations

import numpy as np


def multiplications_error(steps: int) -> int:
    """The relative error of :meth:`BinaryPowers.power` (``steps``) beyond that of F itself, in
    units of one complex multiplication's relative error (first order): ``steps - 1``, at least
    0 (module docstring)."""
    return max(steps - 1, 0)


CACHED_BYTES = 64 * 2**20
"""Memory the cached squarings of one spectrum may hold; the squarings beyond it are recomputed at
every call (the same operations, so the same values)."""


class BinaryPowers:
    """The powers F^T (T >= 0) of one spectrum by binary powering, the squarings cached.

    Args:
        spectrum: F, a one-dimensional complex array (not modified; not copied: the caller
            must not modify it either).
        cached_bytes: memory the cached squarings may hold (bytes, >= 0); default
            :data:`CACHED_BYTES`.
    """

    def __init__(self, spectrum: np.ndarray, *, cached_bytes: int | None = None) -> None:
        if spectrum.ndim != 1:
            raise ValueError("the spectrum must be one-dimensional")
        cached_bytes = CACHED_BYTES if cached_bytes is None else cached_bytes
        if isinstance(cached_bytes, bool) or not isinstance(cached_bytes, int) or cached_bytes < 0:
            raise ValueError(f"cached_bytes must be an integer >= 0, got {cached_bytes!r}")
        self._squares: list[np.ndarray] = [spectrum]
        self._room = cached_bytes // max(spectrum.nbytes, 1)
        """How many squarings may be cached."""
        self._last: tuple[int, np.ndarray] | None = None  # replaced whole (interrupt-safe)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached squarings and the last power, the spectrum itself not counted."""
        held = sum(a.nbytes for a in self._squares[1:])
        return held + (self._last[1].nbytes if self._last is not None else 0)

    @property
    def squarings(self) -> int:
        """How many squarings are cached (changes when memory is allocated)."""
        return len(self._squares) - 1

    def power(self, steps: int) -> np.ndarray:
        """F^steps (a new array, or the last one returned for the same ``steps``; read-only for
        the caller), steps >= 0."""
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        steps = int(steps)
        last = self._last
        if last is not None and last[0] == steps:
            return last[1]
        result: np.ndarray | None = None
        square = self._squares[0]
        for bit in range(steps.bit_length()):
            if bit < len(self._squares):
                square = self._squares[bit]
            else:  # F^(2^bit) from F^(2^(bit - 1)), cached while there is room
                square = square * square
                if len(self._squares) == bit and bit <= self._room:
                    self._squares.append(square)
            if steps >> bit & 1:
                if result is None:
                    result = square.copy()
                else:
                    np.multiply(result, square, out=result)
        if result is None:
            result = np.ones_like(self._squares[0])
        self._last = (steps, result)
        return result
