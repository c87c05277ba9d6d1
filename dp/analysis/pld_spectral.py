"""dp-accounting's hockey-stick scan of a T-fold composed PLD, read from the few Fourier
coefficients that carry it.

The running engine (:mod:`dp.analysis.pld_running`) composes T identical steps as
``irfft(F ** T)`` on N points (F the real DFT of the one-step PMF) and scans the window of the
result from the top. Away from k = 0, |F_k| < 1, so |F_k|^T falls below any tau for all but a few
dozen k once T is in the thousands (the composed PMF is a smooth bump a few standard deviations
wide inside its window): at round 1,000 of the README default (T = 7,000) 35-38 of the 769 to
69,985 coefficients of each grid are above ``TAU``, and about as many at round 10 (the grid
grows with the window).

:class:`SparseSpectrum` keeps the coefficients with |F_k|^T > ``TAU`` and evaluates, for the
window rolled to start at index 0 (p_i = irfft(F^T)[(lower + i) mod N], 0 <= i < b, losses
l_i = l_0 + i d), the two sums the scan accumulates above an index j, in closed form as geometric
series in the kept frequencies: with a_k = c_k (F_k^T) w^(k lower) / N, w = exp(2 pi i / N),
c_k = 1 at k = 0 and N / 2 and 2 otherwise, p_i = Re sum_k a_k w^(k i), and a = j + 1,

- d1(j) = infinity mass + sum_{i=a}^{b-1} p_i, from sum_{i=a}^{b-1} w^(k i) = (w^(a k) - w^(b k)) /
  (1 - w^k) (b - a at k = 0);
- E2(j) = sum_{i=a}^{b-1} p_i exp(l_j - l_i), from rho^(-j) sum_{i=a}^{b-1} (rho w^k)^i =
  rho (w^(a k) - rho^(b - a) w^(b k)) / (1 - rho w^k), rho = exp(-d).

dp-accounting's ``_get_epsilon_for_delta`` runs from the top index down and stops at the first
j with mass_upper > delta, mass_lower > 0 and log((mass_upper - delta) / mass_lower) >= l_j, where
mass_upper = d1(j) and mass_lower = exp(-l_j) E2(j): that is E2(j) > 0 and d1(j) - E2(j) >= delta.
d1(j) - E2(j) = infinity mass + sum_{i > j} p_i (1 - exp(l_j - l_i)) is the hockey-stick
divergence at l_j, non-increasing in j for the non-negative composed PMF (where it is at least
delta, d1 > delta; E2 > 0 in exact arithmetic unless nothing lies above j), so the first stop
from the top is the one j where the predicate holds at j and fails at j + 1; it is found by an interval
search (17 probes around the stop extrapolated from the last two calls, then 32 probes a step)
and checked at both ends. The scan then returns log((d1(j) - delta) / (exp(-l_j) E2(j))) = l_j +
log((d1(j) - delta) / E2(j)), or 0 where that is negative (its last test, mass_upper <=
mass_lower + delta, which it also makes after stopping).

What differs from the dense scan: each dropped coefficient moves every p_i by at most 2 TAU / N,
so d1 and E2 (weights in [0, 1], at most N terms) by at most 2 TAU per dropped coefficient, N TAU
in all (1.4e-25 at N = 139,968); the closed forms round to about 1e-16 times the sum over the kept
k of |a_k| / |1 - w^k| (and |1 - rho w^k|), bounded here (``_ROUNDING``) and added to the result
in epsilon (first order: the bound over d1 - delta plus the bound over E2; typically 1e-10);
where that bound exceeds ``MAX_ERROR`` the caller takes the dense scan. The dense scan itself
reads irfft's values, whose rounding (about 1e-17 N absolute) is what the sparse sums avoid.
Neither bound covers the rounding of F itself, which F^T amplifies T times and which the sparse
and dense scans share (they read the same F); dp-accounting from scratch, on another FFT length,
differs by it: the measured differences are in docs/privacy.md, section 7
(tests/dp/test_pld_spectral.py).

The caller takes the dense scan where this one does not answer (:meth:`SparseSpectrum.epsilon`
returns None): more than ``MAX_KEPT`` or N / ``SPARSE_RATIO`` coefficients kept (short runs, a
composed PMF that is not smooth), k = 0 or every other coefficient dropped, a window
loss beyond +-``MAX_LOSS`` nats (where the dense scan's exp(-loss) terms underflow or overflow
and its degenerate branch can fire), no stop inside the window (epsilon below the window's
lowest loss, or 0), or a rounding bound above ``MAX_ERROR``.
"""

from __future__ import annotations

import math

import numpy as np

TAU = 1e-30
"""Coefficients with |F_k|^T <= TAU (F_0 = 1 - the one-step infinity mass) are dropped."""
MAX_KEPT = 4096
"""More kept coefficients than this: the dense scan (a short run, or a composed PMF that is not
smooth: few expected hits of a small q)."""
SPARSE_RATIO = 16
"""More kept coefficients than N / SPARSE_RATIO: the dense scan, cheaper there (measured: the
sparse scan costs about 0.1-0.4 us a kept coefficient, the dense one 0.02 us a grid point)."""
MAX_LOSS = 600.0
"""A window reaching past +-MAX_LOSS nats goes to the dense scan (module docstring)."""
MAX_ERROR = 1e-8
"""Largest rounding bound in epsilon the sparse result may carry (added to it)."""
PROBES = 32
"""Indices evaluated per step of the interval search."""
_LOG_TAU = math.log(TAU)
_ANGLE = 2j * np.pi
NEAR = 8
"""A predicted stop is checked first on the 2 NEAR + 1 indices around it."""
_ROUNDING = 8 * np.finfo(np.float64).eps
"""Relative rounding of one closed-form term (a few operations of 1 ulp each, with margin)."""


class SparseSpectrum:
    """The kept coefficients of one grid's one-step spectrum, for step counts T >= ``low_steps``.

    Args:
        spectrum: ``rfft`` of the one-step PMF on ``size`` points (size // 2 + 1 values).
        size: N, the number of grid points.
        discretisation: d, the loss grid's spacing (nats).
        low_steps: the smallest T this object is asked about, >= 1; every k dropped for it is
            dropped for every larger T (|F_k| <= 1).
    """

    def __init__(self, *, spectrum: np.ndarray, size: int, discretisation: float, low_steps: int) -> None:
        if size < 2 or spectrum.size != size // 2 + 1:
            raise ValueError("the spectrum must be rfft of the grid's points")
        if low_steps < 1:
            raise ValueError(f"low_steps must be >= 1, got {low_steps}")
        with np.errstate(divide="ignore"):
            log_abs = np.log(np.abs(spectrum))
        k = np.flatnonzero(low_steps * log_abs > _LOG_TAU)
        self.size, self.discretisation, self.low_steps = size, float(discretisation), low_steps
        self.all_k = k
        self.all_log = np.log(spectrum[k].astype(np.complex128))  # log F_k (principal branch)
        self._at: tuple[float, float, tuple | None] | None = None  # (weakest, strongest dropped, constants)
        self._base: tuple[int, np.ndarray, tuple] | None = None  # (T, kept, their constants)

    @property
    def nbytes(self) -> int:
        return self.all_k.nbytes + self.all_log.nbytes

    def kept(self, steps: int) -> np.ndarray:
        """The indices k with |F_k|^steps > TAU."""
        return self.all_k[steps * self.all_log.real > _LOG_TAU]

    def _frequencies(self, steps: int) -> tuple | None:
        """Per-frequency constants of the kept set at ``steps``: (the kept k > 0, log F_0, their
        log F_k, (c_k / N / (1 - w^k), c_k rho / N / (1 - rho w^k)) as a (2, K) array, whether
        N / 2 is kept, w^(m k) for m = 0 .. 2 NEAR, rho / (1 - rho)), or None when the sparse scan
        does not apply.
        The last set is reused while its weakest coefficient is still kept and the strongest one
        it dropped is still dropped (the same comparisons, made for those two only)."""
        if steps < self.low_steps:
            raise ValueError(f"spectrum kept for >= {self.low_steps} steps, asked {steps}")
        if self._at is not None:
            weakest, strongest_dropped, constants = self._at
            if steps * weakest > _LOG_TAU and not steps * strongest_dropped > _LOG_TAU:
                return constants
        magnitudes = self.all_log.real
        mask = steps * magnitudes > _LOG_TAU
        keep = np.flatnonzero(mask)
        too_many = keep.size > min(MAX_KEPT, self.size / SPARSE_RATIO)
        if too_many or keep.size < 2 or self.all_k[keep[0]] != 0:
            constants = None
        else:
            if self._base is None or steps < self._base[0]:  # the kept sets of T >= base's are subsets
                self._base = (steps, keep, self._constants(keep))
            _, base_keep, base = self._base
            sub = np.flatnonzero(steps * magnitudes[base_keep[1:]] > _LOG_TAU)  # the k > 0 kept now
            k = base[0][sub]
            constants = (k, float(self.all_log[keep[0]].real), base[1][sub], base[2][:, sub],
                         bool(2 * k[-1] == self.size), base[3][:, sub], base[4])
        weakest = float(magnitudes[mask].min(initial=0.0))
        self._at = (weakest, float(magnitudes[~mask].max(initial=-np.inf)), constants)
        return constants

    def _constants(self, keep: np.ndarray) -> tuple:
        """(k > 0, log F_k, the (2, K) factors, the w^(m k) table, rho / (1 - rho)) for the kept
        indices ``keep`` (into ``all_k``, k = 0 first); subsets are taken by indexing."""
        n, d = self.size, self.discretisation
        k, log_f = self.all_k[keep[1:]], self.all_log[keep[1:]]
        theta = 2 * np.pi * k / n
        weights = np.where(2 * k == n, 1.0, 2.0) / n  # the Nyquist term once (N even)
        over1 = weights / -np.expm1(1j * theta)
        over2 = weights * math.exp(-d) / -np.expm1(-d + 1j * theta)
        rows = np.arange(2 * NEAR + 1)[:, None]
        table = np.exp(_ANGLE / n * ((rows * k) % n))  # w^(m k), m = 0 .. 2 NEAR
        return k, log_f, np.stack((over1, over2)), table, math.exp(-d) / -math.expm1(-d)

    def epsilon(self, *, steps: int, lower: int, length: int, first_loss: int, infinity_mass: float,
                delta: float, hint: int | None = None) -> tuple[float, int] | None:
        """(epsilon, stopping index j) of dp-accounting's scan of the window of ``length`` indices
        starting at circular index ``lower`` of irfft(F^steps), whose loss grid starts at
        ``first_loss`` * d, with ``infinity_mass`` (< delta); None where the dense scan must answer
        (module docstring). ``hint``: the expected stop (extrapolated from the last calls), which
        changes only how fast it is found: the 2 ``NEAR`` + 1 indices around it are probed first."""
        constants = self._frequencies(steps)
        top = length - 1  # the scan's predicate fails at the top index (nothing above it)
        d = self.discretisation
        far = max(abs(first_loss), abs(first_loss + top)) * d > MAX_LOSS
        if constants is None or not 1 <= top < self.size or far:  # (a window longer than N: never)
            return None
        k, log_f0, log_f, over, nyquist, table, rho_sum = constants
        n, b = self.size, length
        a0 = math.exp(steps * log_f0) / n  # F_0 is real: the one-step mass
        if hint is not None:
            hint = min(max(hint, 0), top - 1)
            probes = np.arange(max(hint - NEAR, 0), min(hint + NEAR + 1, top))
        else:
            probes = np.unique(np.linspace(0, top - 1, PROBES + 1).round().astype(np.int64))
        # w^(k lower) (the roll), w^(k b) (the window's end), w^(k a) for the first probe's a = j + 1;
        # sums are elementwise products summed by numpy, not matrix products: a threaded BLAS
        # call costs milliseconds on a loaded machine
        phases = np.exp(_ANGLE / n * ((np.array([lower, b, probes[0] + 1])[:, None] * k) % n))
        power = np.exp(steps * log_f)  # F_k^T
        if nyquist:  # the largest k kept is N / 2: irfft reads the real part of F_{N/2}^T only
            power[-1] = power[-1].real
        coefficient = power * phases[0]
        column_sums = (coefficient * over).sum(axis=1)  # of a_k / (1 - w^k), of a_k rho / (1 - rho w^k)
        wb1, wb2 = ((phases[1] * coefficient * over).sum(axis=1) - column_sums).real  # of (w^(b k) - 1) x
        sum1, sum2 = float(column_sums[0].real), float(column_sums[1].real)
        wb1, wb2 = float(wb1), float(wb2)
        # d1 = infinity + a0 (b - a) + Z1 - sum1 - wb1 and E2 = c2 (1 - rho^(b - a)) + Z2 - sum2 - wb2
        # with Z = Re sum_k w^(a k) x each column and c2 = a0 rho_sum + sum2 + wb2
        c2 = a0 * rho_sum + sum2 + wb2
        columns = coefficient * (over[0] - over[1])  # Z1 - Z2 from one sum
        offset = infinity_mass - sum1 - wb1 + sum2 + wb2 + a0 * b

        def hockey(j: np.ndarray, first: bool) -> np.ndarray:
            """d1 - E2 above each index of ``j`` (the hockey stick at l_j); ``first``: ``j`` is the
            first probes, consecutive (w^(a k) = w^(a_0 k) w^(m k))."""
            a = j + 1
            if first and a.size <= table.shape[0] and a[-1] - a[0] == a.size - 1:
                z = (table[:a.size] * (phases[2] * columns)).sum(axis=1).real
            else:
                z = (np.exp(_ANGLE / n * ((a[:, None] * k) % n)) * columns).sum(axis=1).real
            return z + offset - a0 * a + c2 * np.expm1((a - b) * d)

        lo, hi = -1, top
        hockey_lo, hockey_hi = math.inf, 0.0
        first = True
        while probes.size:
            # the predicate without E2 > 0: far below the stop E2 is below its rounding and may
            # come out <= 0 where the exact value (positive) makes the predicate hold; at lo it
            # is checked exactly below
            values = hockey(probes, first)
            first = False
            true_idx = np.flatnonzero(values >= delta)
            last = int(true_idx[-1]) if true_idx.size else -1
            if last >= 0 and probes[last] > lo:
                lo, hockey_lo = int(probes[last]), float(values[last])
            if last + 1 < probes.size and probes[last + 1] < hi:
                hi, hockey_hi = int(probes[last + 1]), float(values[last + 1])
            if hi - lo <= 1:
                break
            probes = _next_probes(lo, hi, hockey_lo, hockey_hi, delta)
        if lo < 0:
            return None  # no stop inside the window: the dense scan's last branches
        # d1 and E2 at lo from the same operations whichever probes found it (rounding differs)
        a = lo + 1
        z1, z2 = (np.exp(_ANGLE / n * ((a * k) % n)) * coefficient * over).sum(axis=1).real
        count = b - a
        one_minus_r = -math.expm1(count * -d)
        d1 = infinity_mass + a0 * count + (z1 - sum1 - wb1)
        e2 = c2 * one_minus_r + (z2 - sum2 - wb2)
        if not (d1 > delta and e2 > 0):
            return None
        bound1, bound2 = (np.abs(coefficient) * np.abs(over)).sum(axis=1)
        err1 = _ROUNDING * (4 * bound1 + a0 * count) + n * TAU
        err2 = _ROUNDING * (5 * bound2 + a0 * rho_sum) + n * TAU
        error = err1 / (d1 - delta) + err2 / e2
        if not error <= MAX_ERROR:
            return None
        # after its loop the scan returns 0 where mass_upper <= mass_lower + delta: epsilon <= 0
        return max(0.0, float((first_loss + lo) * d + math.log((d1 - delta) / e2) + error)), lo


def _next_probes(lo: int, hi: int, hockey_lo: float, hockey_hi: float, delta: float) -> np.ndarray:
    """Probes strictly inside (lo, hi) (index 0 first while no stop is known, lo = -1): evenly
    spaced, plus 17 around the index where the logarithm of the hockey stick, interpolated
    linearly between lo and hi, crosses log(delta)."""
    if lo < 0:
        spread = np.linspace(0, hi, PROBES + 1).round().astype(np.int64)[:-1]
        return np.unique(spread[spread < hi])
    spread = np.linspace(lo, hi, PROBES // 2 + 2).round().astype(np.int64)[1:-1]
    guess = (lo + hi) // 2
    if hockey_lo > delta and hockey_hi > 0:
        fraction = math.log(hockey_lo / delta) / math.log(hockey_lo / hockey_hi)
        guess = lo + int(round(fraction * (hi - lo)))
    near = guess + np.arange(-NEAR, NEAR + 1)
    candidates = np.unique(np.concatenate((spread, near)))
    return candidates[(candidates > lo) & (candidates < hi)]
