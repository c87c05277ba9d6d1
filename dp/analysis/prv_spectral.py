"""Opacus' PRV epsilon search, read from the few Fourier coefficients that carry the composed PMF.

Opacus composes T identical steps as ``irfft(F ** T)`` with F the real DFT of the one-step PMF on
n points (n in the millions at large epsilon: the domain is [-L, L] with L from an RDP tail bound
and the mesh shrinks like 1 / sqrt(T)), then searches the hockey-stick curve of the result.
Away from k = 0, |F_k| < 1, so |F_k|^T falls below any tau except for a few dozen k: at round
1,000 of every accountant benchmark with epsilon >= 25, 34-86 of the 0.4-7.5 million
coefficients are above 1e-30 (the composed PMF is a smooth bump thousands of mesh cells wide).

:class:`SparseComposition` keeps only the coefficients with |F_k|^T_low > ``TAU`` for the
smallest step count T_low it will be asked about (so also for every larger T), and evaluates the
rolled composed PMF's suffix sums in closed form, as geometric series in the kept frequencies:
for p_m = (1 / n) Re sum_k c_k C_k w^(m k), w = exp(2 pi i / n), c_k = 1 at k = 0 and n / 2 and
2 otherwise,

- d1(i) = sum_{m >= i} p_m, from sum_{m=i}^{n-1} w^(m k) = (w^(i k) - 1) / (1 - w^k) (n - i at k = 0);
- E2(i) = sum_{m >= i} p_m exp(t_i - t_m), from sum_{m=i}^{n-1} (rho w^k)^m rho^(-i)
  = (w^(i k) - rho^(n - i)) / (1 - rho w^k), rho = exp(-dt).

Opacus' search (``DiscretePRV.compute_epsilon``) is: the first index i whose hockey stick
delta(t_i) = d1(i) - E2(i) is at most the target (its ``ndelta`` is -delta(t_i), searched with
``searchsorted``), then epsilon = log((d1(i) - target) / d2(i)) = t_i + log((d1(i) - target) /
E2(i)). Here the same search runs as a 32-way interval search over the index, each step
O(32 K) for K kept coefficients, instead of an n-point inverse FFT and a scan.

What dropping costs: each dropped coefficient changes every PMF value by at most 2 TAU / n, so
d1, E2 and delta(t) (weights in [0, 1]) move by at most TAU (n + 2) <= 2.2e-21 for n < 2^31,
against targets of delta - delta / 1000 >= 1e-12 in practice. The closed forms add rounding of
about 1e-16 times the sum of |c_k C_k| / |1 - w^k| over the kept k, far below the ``MARGIN``
that the engine adds (tests/dp/test_prv_spectral.py measures agreement with Opacus' dense
search to 1e-9 in epsilon).
"""

from __future__ import annotations

import math

import numpy as np

TAU = 1e-30
"""Coefficients with |F_k|^T <= TAU (the composed PMF's DFT, F_0 = 1) are dropped."""
PROBES = 32
"""Indices evaluated per step of the interval search."""
OPACUS_FINITE_T = 690.0
"""Above this t_i (nats) Opacus' own arithmetic stops being finite: its d2 sums p_m exp(-t_m) term
by term, and each term underflows to 0 once t_m > 744 + ln p_m (tail masses p_m of 1e-12 and less
vanish from t = 716), which leaves d2 = 0 and epsilon = inf, where the closed-form E2 (scaled by
exp(t_i)) stays finite (review S6-4). At t_i <= 690 every term with p_m >= 1e-14 is a normal or
subnormal float with relative error <= 5e-6, far inside ``MARGIN``; above it the sparse search
reports inf, so it is never below Opacus' from-scratch value."""


def kept_frequencies(spectrum: np.ndarray, low_steps: int) -> np.ndarray:
    """Indices k of the real spectrum with |F_k|^low_steps > TAU; every other k has
    |F_k|^T <= TAU for every T >= low_steps (|F_k| <= 1)."""
    with np.errstate(divide="ignore"):
        log_abs = np.log(np.abs(spectrum))
    return np.flatnonzero(low_steps * log_abs > math.log(TAU))


class SparseComposition:
    """The T-fold composition of a discretised one-step PRV, T >= ``low_steps``, from the kept
    coefficients of its real DFT.

    Args:
        spectrum: ``rfft`` of the one-step PMF (n / 2 + 1 values), n = ``size`` even.
        size: n, the number of mesh points.
        low_steps: the smallest step count T this composition is asked about, >= 1.
        frequencies: the kept indices (default :func:`kept_frequencies`).
    """

    def __init__(self, *, spectrum: np.ndarray, size: int, low_steps: int,
                 frequencies: np.ndarray | None = None) -> None:
        if size % 2 or spectrum.size != size // 2 + 1:
            raise ValueError("the spectrum must be rfft of an even number of points")
        if low_steps < 1:
            raise ValueError(f"low_steps must be >= 1, got {low_steps}")
        k = kept_frequencies(spectrum, low_steps) if frequencies is None else frequencies
        self.size = size
        self.low_steps = low_steps
        self.k = k.astype(np.int64)
        coefficients = spectrum[k].astype(np.complex128)
        edge = (self.k == 0) | (self.k == size // 2)
        coefficients[edge] = coefficients[edge].real  # irfft ignores their imaginary parts
        self.coefficients = coefficients
        self.weights = np.where(edge, 1.0, 2.0) / size
        theta = 2 * np.pi * self.k / size
        self.one_minus_w = -np.expm1(1j * theta)  # 1 - w^k; 0 at k = 0 (handled apart)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.coefficients.nbytes + self.weights.nbytes + self.one_minus_w.nbytes

    def _rolled(self, steps: int, shift: int) -> np.ndarray:
        """a_k = c_k C_k^T w^(-shift k) / n: the coefficients of the PMF rolled by ``shift``."""
        if steps < self.low_steps:
            raise ValueError(f"composition built for >= {self.low_steps} steps, asked {steps}")
        phase = (shift * self.k) % self.size
        return self.weights * self.coefficients ** steps * np.exp(-2j * np.pi * phase / self.size)

    def _sums(self, a: np.ndarray, index: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """(d1, E2) at each index of ``index`` (module docstring)."""
        n = self.size
        i = index.astype(np.int64)[:, None]
        w_ik_minus_one = np.expm1(2j * np.pi * ((i * self.k) % n) / n)
        nonzero = self.k != 0
        s1 = np.empty(w_ik_minus_one.shape, dtype=np.complex128)
        s1[:, nonzero] = w_ik_minus_one[:, nonzero] / self.one_minus_w[nonzero]
        s1[:, ~nonzero] = (n - i).astype(np.float64)
        one_minus_tail = -np.expm1(-(n - i) * dt)  # 1 - rho^(n - i)
        s2 = (w_ik_minus_one + one_minus_tail) / -np.expm1(-dt + 2j * np.pi * self.k / n)
        # elementwise products, not a matrix product: BLAS threads cost more than these sums
        d1 = (s1 * a).sum(axis=1).real
        e2 = (s2 * a).sum(axis=1).real
        return d1, e2

    def epsilon(self, steps: int, shift: int, t_min: float, dt: float, target: float) -> float:
        """Opacus' ``find_epsilon(target)`` on the composed PMF rolled by ``shift`` on the grid
        t_i = ``t_min`` + i ``dt`` (i < n), without the eps_error it adds. Raises
        RuntimeError("Cannot compute epsilon") where Opacus does (the first index is below), and
        where rounding would leave its final formula undefined (the caller then computes it
        exactly)."""
        return self.search(steps, shift, t_min, dt, target)[0]

    def search(self, steps: int, shift: int, t_min: float, dt: float, target: float, *,
               hint: int | None = None) -> tuple[float, int]:
        """:meth:`epsilon` and the index i it found. ``hint`` (the index of a nearby search, e.g.
        the last round's) brackets the interval search first: +-64 indices, widened 8 times
        over until the hockey stick crosses the target inside; the index found is the same."""
        a = self._rolled(steps, shift)
        size = self.size
        if self._delta(a, 0, dt) <= target:
            raise RuntimeError("Cannot compute epsilon")
        lo, hi = 0, size - 1  # delta(t_{n-1}) = 0 <= target: hi always qualifies
        if hint is not None:
            width = 64
            while width < size:
                low, high = max(hint - width, 0), min(hint + width, size - 1)
                d1, e2 = self._sums(a, np.array([low, high]), dt)
                if (low == 0 or d1[0] - e2[0] > target) and d1[1] - e2[1] <= target:
                    lo, hi = low, high
                    break
                width *= 8
        while hi - lo > 1:  # invariant: delta(t_lo) > target >= delta(t_hi)
            probes = np.unique(np.linspace(lo, hi, PROBES + 2).round().astype(np.int64)[1:-1])
            probes = probes[(probes > lo) & (probes < hi)]
            d1, e2 = self._sums(a, probes, dt)
            below = np.flatnonzero(d1 - e2 <= target)
            if below.size:
                hi = int(probes[below[0]])
                if below[0] > 0:
                    lo = int(probes[below[0] - 1])
            else:
                lo = int(probes[-1])
        d1, e2 = self._sums(a, np.array([hi]), dt)
        if not (d1[0] > target and e2[0] > 0):  # never in exact arithmetic (delta(t_lo) > target)
            raise RuntimeError("Cannot compute epsilon")
        if t_min + hi * dt > OPACUS_FINITE_T:
            return math.inf, hi
        return float(t_min + hi * dt + np.log((d1[0] - target) / e2[0])), hi

    def _delta(self, a: np.ndarray, index: int, dt: float) -> float:
        d1, e2 = self._sums(a, np.array([index]), dt)
        return float(d1[0] - e2[0])
