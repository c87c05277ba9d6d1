"""Constant-cost PLD epsilon for a long run of identical subsampled-Gaussian steps.

A run's ledger is, per kind of party, one :class:`~dp.ledger.GaussianEvent` whose step count T
grows every round. dp-accounting computes its epsilon from scratch: it builds the PLD of one step
(a Python loop over the loss grid), self-composes it T times (FFT, a complex power, inverse FFT)
and scans the result in a Python loop; at round 1,000 that is 0.5 to 4 s for each discretisation
the refinement of :mod:`dp.analysis.pld` tries.

:class:`RunningPLD` computes the same quantities for one (sigma, q, discretisation), keeping
what does not depend on T:

- the one-step PMFs (dp-accounting's own ``from_gaussian_mechanism``, the same pessimistic
  rounding) and their log moment-generating functions at dp-accounting's orders, from which the
  truncation window of T compositions (``common.compute_self_convolve_bounds``: the same Chernoff
  bound, the same tail mass 1e-15) follows in O(1);
- the real FFT F of each PMF on a grid of N points, N read off a fixed ladder
  (:func:`grid_size`: ``LADDER_STEPS`` rungs an octave, rounded up to a fast FFT length) from
  the window of the T asked alone, and F^T by binary powering from cached squarings
  (:class:`~dp.analysis.spectral_power.BinaryPowers`). So the value for T is a function of
  (sigma, q, discretisation, T, delta) alone, bit for bit, whatever the engine was asked before
  (a resumed run, a sweep's second experiment, a test after another: the same epsilon as a fresh
  process);
- the hockey-stick scan of dp-accounting's ``_get_epsilon_for_delta`` as cumulative sums over the
  window, in the same order of summation.

That dense path costs an N-point inverse FFT and a complex power of N / 2 values a query (5 ms a
round at round 1,000 of the README default over the five discretisations tried). Once T is in
the hundreds only a few dozen of the N / 2 coefficients of F^T stay above 1e-30, and the scan is
read from those in closed form (:mod:`dp.analysis.pld_spectral`, about 30-60 us a direction,
whatever N); the dense path answers where the sparse one does not (more than N / 16 kept
coefficients, losses beyond 600 nats, a rounding bound above 1e-8 in epsilon, no stop inside the
window). ``SPARSE = False`` turns the sparse path off (the benchmark's reference).

What differs from the from-scratch value: the FFT length (N is at least dp-accounting's, so the
wrap-around of the truncated tails, at most 1e-15 of mass, is no larger), floating-point rounding
of the binary powering (bounded in :meth:`_RunningPMF.rounding_mass`), and ``np.exp``
against ``math.exp`` in the scan (one ulp). Their effect on epsilon is below 1e-9 at every
regime tested (tests/dp/test_running_accountant.py), far inside the 0.001 the refinement works
to; the refinement itself (which discretisations are tried, when it stops) is unchanged. The
sparse scan differs from the dense one by at most 1e-7 at delta >= 1e-7 in the regimes tested
(tests/dp/test_pld_spectral.py: by the FFT's rounding, which it does not read), and from
dp-accounting from scratch by less than ``pld.RUNNING_MARGIN``.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_module
from fedsec.dp.analysis.pld_spectral import SparseSpectrum
from fedsec.dp.analysis.spectral_power import BinaryPowers, multiplications_error
from scipy import fft, special

TAIL_MASS = 1e-15
"""The tail mass dp-accounting's ``self_compose`` may truncate (its default)."""
LADDER_STEPS = 4
"""Rungs of the grid sizes' ladder an octave (:func:`grid_size`): a grid is at most 2^(1/4), about
1.19, times the window it holds (before the fast length), and a window growing like sqrt(T)
changes rung every 41 % of growth in T."""
SKIP_GAP = 0.01
"""A neighbour direction is skipped only when its upper bound is this far below the other's value
(ten times the refinement's agreement), a safety margin on top of the bound's argument."""
RESPARSIFY = 4
"""The kept coefficients are recomputed from the whole spectrum when T reaches this many times the
step count they were kept for (fewer stay above the threshold as T grows)."""
SPARSE = True
"""Use the sparse scan where it answers (False: always the dense one; for the benchmark's and
tests' comparisons)."""
ROUNDING_ULPS = 7
"""The error of one FFT stage in units of the roundoff u: Higham's eta = mu + gamma_4 (sqrt(2) +
mu) with a twiddle-factor error mu of about u is 6.7 u (:meth:`_RunningPMF.rounding_mass`)."""
ROUNDING_FLOOR = -60.0
ROUNDING_RUNGS = 32
"""The sums over |F_k|^(T-1) in the rounding bound are taken at the exponent's rung
(:func:`rounding_anchor`: the largest floor(2^(j / ROUNDING_RUNGS)) at or below T - 1, 2.2 % apart,
every integer up to 46): |F_k| <= 1, so a smaller exponent only raises them (a valid, slightly
larger bound), and they are computed once a rung instead of at every query."""
"""Coefficients with (T - 1) log |F_k| below this are each bounded by e^ROUNDING_FLOOR in the
rounding bound rather than summed (cheap with the magnitudes sorted)."""
_U = float(np.finfo(np.float64).eps) / 2
CACHE_SIZE = 24
"""Engines kept at most (one per sigma, q, discretisation; least recently used dropped)."""
CACHE_BYTES = 256 * 2**20
"""Memory the kept engines may hold (their spectra and powers); least recently used dropped
first, the one in use always kept. A calibration's bisection over sigma would otherwise keep
a fine grid for every sigma it tried."""


_LOG_TAIL = math.log(2 / TAIL_MASS)


def grid_size(needed: int) -> int:
    """The FFT length for a window of ``needed`` >= 1 points: the smallest rung
    ceil(2^(j / LADDER_STEPS)) >= ``needed`` of the ladder, rounded up to a fast real-FFT length
    (a function of ``needed`` alone)."""
    if needed < 1:
        raise ValueError(f"needed must be >= 1, got {needed}")
    rung = math.ceil(LADDER_STEPS * math.log2(needed))
    while math.ceil(2.0 ** (rung / LADDER_STEPS)) < needed:
        rung += 1
    return _rung_size(rung)


@functools.lru_cache(maxsize=512)
def _rung_size(rung: int) -> int:
    """The fast real-FFT length at or above the ladder's rung ``rung`` (cached: asked at every query)."""
    return fft.next_fast_len(math.ceil(2.0 ** (rung / LADDER_STEPS)), real=True)


@functools.lru_cache(maxsize=4096)
def rounding_anchor(exponent: int) -> int:
    """The largest rung floor(2^(j / ROUNDING_RUNGS)) <= ``exponent`` (>= 1), a function of
    ``exponent`` alone."""
    if exponent < 1:
        raise ValueError(f"exponent must be >= 1, got {exponent}")
    rung = math.floor(ROUNDING_RUNGS * math.log2(exponent))
    while rung > 0 and math.floor(2.0 ** (rung / ROUNDING_RUNGS)) > exponent:
        rung -= 1
    while math.floor(2.0 ** ((rung + 1) / ROUNDING_RUNGS)) <= exponent:
        rung += 1
    return math.floor(2.0 ** (rung / ROUNDING_RUNGS))


def _orders(size: int) -> np.ndarray:
    """dp-accounting's orders for the Chernoff bound of ``compute_self_convolve_bounds``."""
    return np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / size


class _RunningPMF:
    """One dense PMF (probabilities on the grid lower_loss * d, (lower_loss + 1) * d, ...) and its
    T-fold self-composition."""

    def __init__(self, pmf) -> None:
        # dp-accounting exposes no public accessor for a PMF's grid; its attributes are read here
        # and pinned by tests/dp/test_running_accountant.py against its own self_compose.
        dense = pmf.to_dense_pmf()
        self.probs = np.asarray(dense._probs, dtype=np.float64)
        self.lower_loss = int(dense._lower_loss)
        self.infinity_mass = float(dense._infinity_mass)
        self.discretisation = float(dense._discretization)
        orders = _orders(self.probs.size)
        grid = np.arange(self.probs.size)
        log_mgfs = np.array([special.logsumexp(grid * order, b=self.probs) for order in orders])
        self.moments = ((orders[orders > 0], log_mgfs[orders > 0]),
                        (orders[orders < 0], log_mgfs[orders < 0]))
        # Each piece of state is one attribute holding a tuple, replaced whole, so that an
        # interrupt (Ctrl-C between two bytecodes) leaves the old state or the new one, never a
        # power that does not match its step count.
        self.grid: tuple[int, np.ndarray | None] = (0, None)  # (N, F)
        self.powers: tuple[int, BinaryPowers] | None = None  # (N, the powers of this grid's F)
        self.sparse: SparseSpectrum | None = None  # the kept coefficients of this grid
        self.stops: tuple[tuple[int, int], ...] = ()  # the last two sparse scans' (T, stop's loss index)
        self.last_bounds: tuple[int, tuple[int, int]] = (0, (0, 0))  # (steps, bounds(steps))
        self.log_magnitudes: tuple[int, np.ndarray] | None = None  # (N, -log |F_k| ascending)
        self.rounding_sums: tuple[int, int, float, float] | None = None  # (N, anchor, linear, square)
        self.version = 0  # counts the (re)allocations of the arrays above (the cache's memory check)

    @property
    def nbytes(self) -> int:
        arrays = (self.probs, self.grid[1])
        if self.log_magnitudes is not None:
            arrays += (self.log_magnitudes[1],)
        held = self.powers[1].nbytes if self.powers else 0
        held += self.sparse.nbytes if self.sparse else 0
        return sum(a.nbytes for a in arrays if a is not None) + held

    def bounds(self, steps: int) -> tuple[int, int]:
        """``common.compute_self_convolve_bounds(probs, steps, TAIL_MASS)`` from cached moments
        (the same floating-point operations, vectorised over the orders of each sign); the last
        answer is kept (a query asks for the same steps twice)."""
        last = self.last_bounds
        if last[0] == steps:
            return last[1]
        answer = self._bounds(steps)
        self.last_bounds = (steps, answer)
        return answer

    def _bounds(self, steps: int) -> tuple[int, int]:
        upper, lower = (self.probs.size - 1) * steps, 0
        (positive, log_positive), (negative, log_negative) = self.moments
        high = ((steps * log_positive + _LOG_TAIL) / positive).min()
        low = ((steps * log_negative + _LOG_TAIL) / negative).max()
        if not (math.isfinite(high) and math.isfinite(low)):  # dp-accounting skips those orders
            with np.errstate(over="ignore", invalid="ignore"):
                both = [(steps * lm + _LOG_TAIL) / o for o, lm in ((positive, log_positive),
                                                                    (negative, log_negative))]
            high = min(both[0][np.isfinite(both[0])], default=math.inf)
            low = max(both[1][np.isfinite(both[1])], default=-math.inf)
        if math.isfinite(high):
            upper = min(upper, math.ceil(high))
        if math.isfinite(low):
            lower = max(lower, math.floor(low))
        return lower, upper

    def _power_to(self, steps: int) -> np.ndarray:
        """F^steps on the current grid, by binary powering (the same array whatever was asked
        before; module docstring)."""
        size, spectrum = self.grid
        powers = self.powers
        if powers is None or powers[0] != size:
            powers = self.powers = (size, BinaryPowers(spectrum))
            self.version += 1
        held = powers[1].squarings
        power = powers[1].power(steps)
        self.version += powers[1].squarings != held
        return power

    def _grid_for(self, length: int) -> None:
        """Builds the FFT grid of :func:`grid_size` for a window of ``length`` points (and drops what
        was kept on the previous grid) when it is not the current one."""
        size = grid_size(max(length, self.probs.size))
        if size != self.grid[0]:
            spectrum = fft.rfft(self.probs, size)
            self.sparse = None  # first: an interrupt here leaves the old grid, whose kept set is rebuilt
            self.grid = (size, spectrum)
            self.version += 1

    def composed(self, steps: int) -> tuple[int, np.ndarray, float]:
        """(lower loss index, probabilities, infinity mass) of ``steps`` self-compositions, as
        dp-accounting's ``DensePLDPmf.self_compose(steps)`` gives them."""
        lower, upper = self.bounds(steps)
        length = upper - lower + 1
        self._grid_for(length)
        size = self.grid[0]
        values = fft.irfft(self._power_to(steps), size)
        start = lower % size  # the window's first index on the circular grid
        if start + length <= size:  # the window lies inside the grid: a view
            window = values[start:start + length]
        else:  # it wraps around the grid once (length < size): two slices
            window = np.concatenate((values[start:], values[:start + length - size]))
        return self.lower_loss * steps + lower, window, self.infinity(steps)

    def infinity(self, steps: int) -> float:
        """The composed infinity mass plus the truncated tails (dp-accounting's ``self_compose``)."""
        return TAIL_MASS - math.expm1(steps * math.log1p(-self.infinity_mass))

    def _spectrum_for(self, steps: int) -> SparseSpectrum:
        """The kept coefficients for ``steps``, rebuilt from the grid's spectrum when ``steps`` is
        below the last build's or at least ``RESPARSIFY`` times it (fewer are kept as T grows)."""
        sparse = self.sparse
        if sparse is None or not sparse.low_steps <= steps < RESPARSIFY * sparse.low_steps:
            size, spectrum = self.grid
            sparse = self.sparse = SparseSpectrum(spectrum=spectrum, size=size,
                                                  discretisation=self.discretisation, low_steps=steps)
            self.version += 1
        return sparse

    def _predicted_stop(self, steps: int) -> int | None:
        """The loss index where the scan is expected to stop: the last two sparse scans' stops
        extrapolated linearly in T, or the last one's."""
        if len(self.stops) == 2 and self.stops[0][0] != self.stops[1][0]:
            (t0, j0), (t1, j1) = self.stops
            return j1 + round((j1 - j0) * (steps - t1) / (t1 - t0))
        return self.stops[-1][1] if self.stops else None

    def epsilon(self, steps: int, delta: float) -> float:
        """dp-accounting's ``self_compose(steps).get_epsilon_for_delta(delta)``, scanned at
        ``delta`` less :meth:`rounding_mass` (so that the value bounds the exact composed PMF's,
        whatever the floating-point rounding of the FFT did to the tail mass; inf where that bound
        is not below ``delta``): the sparse scan (:mod:`dp.analysis.pld_spectral`) where it
        answers, else the dense one."""
        margin = self.rounding_mass(steps)
        if not margin < delta:
            return math.inf
        value = self.sparse_epsilon(steps, delta - margin) if SPARSE else None
        return self.dense_epsilon(steps, delta - margin) if value is None else value

    def rounding_mass(self, steps: int) -> float:
        """An upper bound on how far floating-point rounding moves the hockey-stick divergence of
        the ``steps``-fold composed PMF the scans read, at every epsilon (a probability, >= 0).

        With u the unit roundoff and eta = ``ROUNDING_ULPS`` u the error of one FFT stage (a
        butterfly and a twiddle factor, Higham, *Accuracy and Stability of Numerical Algorithms*,
        section 24.1), each coefficient of the computed rfft of the PMF is off by at most
        e_F = eta (log2 N + 1) sum_j p_j <= eta (log2 N + 1) (a summation tree of that depth), so
        F_k^T by at most T |F_k|^(T-1) e_F, plus the binary powering's multiplications (at most
        T - 1 of relative eta: :func:`~dp.analysis.spectral_power.multiplications_error`; 2 more
        for margin) and the inverse FFT's own rounding: in all
        |Delta_k| <= |F_k|^(T-1) eta ((T + 1)(log2 N + 1) + (T - 1) + 2). The divergence
        weighs each of the window's L points by a factor in [0, 1], so it moves by at most the
        sum of the L points' errors, bounded two ways and the smaller taken: L max_i |e_i| <=
        L (2 / N) sum_k |Delta_k|, and (Cauchy-Schwarz, then Parseval) sqrt(L) ||e||_2 <=
        sqrt(L) sqrt(2 / N) (sum_k |Delta_k|^2)^(1/2). The scan's cumulative sums (terms <= 1) add
        at most 2 L u. A scan at delta minus this bound returns an epsilon whose divergence under
        the exact composed PMF is at most delta (docs/privacy.md, section 7: "FFT rounding
        against a small delta")."""
        lower, upper = self.bounds(steps)
        length = upper - lower + 1
        self._grid_for(length)
        size = self.grid[0]
        ordered = self._log_magnitudes()
        exponent = max(steps - 1, 0)
        if exponent:  # at its rung: the terms above e^ROUNDING_FLOOR summed, each of the rest bounded by it
            anchor = rounding_anchor(exponent)
            sums = self.rounding_sums
            if sums is None or sums[:2] != (size, anchor):
                count = int(np.searchsorted(ordered, -ROUNDING_FLOOR / anchor, side="left"))
                top = np.exp(-anchor * ordered[:count])
                rest = ordered.size - count
                sums = self.rounding_sums = (size, anchor,
                                             float(top.sum()) + rest * math.exp(ROUNDING_FLOOR),
                                             float((top * top).sum()) + rest * math.exp(2 * ROUNDING_FLOOR))
            linear, square = sums[2], sums[3]
        else:
            linear = square = float(ordered.size)
        log_size = math.log2(size) + 1
        per_coefficient = ROUNDING_ULPS * _U * ((steps + 1) * log_size + multiplications_error(steps) + 2)
        pointwise = length * 2 * linear / size * per_coefficient
        in_norm = math.sqrt(length * 2 * square / size) * per_coefficient
        return min(pointwise, in_norm) + 2 * length * _U

    def _log_magnitudes(self) -> np.ndarray:
        """-log |F_k| of the grid's spectrum, ascending (the largest |F_k| first; once per grid)."""
        cached = self.log_magnitudes
        if cached is None or cached[0] != self.grid[0]:
            with np.errstate(divide="ignore"):
                ordered = np.sort(-np.log(np.abs(self.grid[1])))
            cached = self.log_magnitudes = (self.grid[0], ordered)
        return cached[1]

    def sparse_epsilon(self, steps: int, delta: float) -> float | None:
        """The sparse scan's epsilon, or None where it does not answer (then the dense scan must;
        also None for an infinity mass above ``delta``, whose epsilon is inf)."""
        lower, upper = self.bounds(steps)
        length = upper - lower + 1
        self._grid_for(length)
        infinity = self.infinity(steps)
        if infinity > delta:
            return None
        first_loss = self.lower_loss * steps + lower
        hint = self._predicted_stop(steps)
        found = self._spectrum_for(steps).epsilon(
            steps=steps, lower=lower, length=length, first_loss=first_loss, infinity_mass=infinity,
            delta=delta, hint=None if hint is None else hint - first_loss)
        if found is None:
            return None
        self.stops = (*self.stops[-1:], (steps, first_loss + found[1]))
        return found[0]

    def dense_epsilon(self, steps: int, delta: float) -> float:
        """The dense scan's epsilon: irfft of the running power, scanned (module docstring)."""
        lower_loss, probs, infinity = self.composed(steps)
        return epsilon_for_delta(infinity, lower_loss, self.discretisation, probs, delta)


def epsilon_for_delta(infinity_mass: float, lower_loss: int, discretisation: float,
                      probs: np.ndarray, delta: float) -> float:
    """dp-accounting's ``_get_epsilon_for_delta`` (the smallest epsilon whose hockey-stick
    divergence is at most ``delta``) for the PMF ``probs`` on the grid starting at
    ``lower_loss * discretisation``. Its loop runs from the largest loss down and stops where the
    loss falls below the epsilon of the mass above it; here it runs as cumulative sums, in the same
    order of summation, over chunks from the top, so only the part above epsilon is read."""
    if infinity_mass > delta:
        return math.inf
    size = probs.size
    chunk = max(4096, size // 32)
    loss = (lower_loss + size - 1) * discretisation  # itertools.count(upper, -d): repeated additions
    mass_upper, mass_lower = infinity_mass, 0.0
    reversed_probs = probs[::-1]
    for start in range(0, size, chunk):
        part = reversed_probs[start:start + chunk]
        steps = np.full(part.size, -discretisation)
        steps[0] = loss if start == 0 else loss - discretisation
        losses = np.cumsum(steps)
        loss = float(losses[-1])
        upper = np.cumsum(np.concatenate(([mass_upper], part)))  # [k]: before element k
        # entries past the stopping point may overflow; they are never read
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lower = np.cumsum(np.concatenate(([mass_lower], np.exp(-losses) * part)))
            stop = (upper[:-1] > delta) & (lower[:-1] > 0) & (
                np.log((upper[:-1] - delta) / lower[:-1]) >= losses)
        first = int(np.argmax(stop)) if stop.any() else part.size
        degenerate = np.flatnonzero((upper[1:first + 1] >= delta) & (lower[1:first + 1] == 0))
        if degenerate.size:
            return max(0.0, float(losses[degenerate[0]]))
        mass_upper, mass_lower = float(upper[first]), float(lower[first])
        if first < part.size:
            break
    if mass_upper <= mass_lower + delta:
        return 0.0
    return math.log((mass_upper - delta) / mass_lower)


class RunningPLD:
    """The pessimistic PLD epsilon of T Poisson-subsampled Gaussian steps, for any T, at one
    discretisation; cheap when T grows from call to call (module docstring).

    Args:
        noise_multiplier: sigma > 0.
        sample_rate: q in (0, 1).
        discretisation: dp-accounting's value discretisation interval.
    """

    def __init__(self, *, noise_multiplier: float, sample_rate: float, discretisation: float) -> None:
        pld = pld_module.from_gaussian_mechanism(
            standard_deviation=noise_multiplier, value_discretization_interval=discretisation,
            sampling_prob=sample_rate)
        self.remove = _RunningPMF(pld._pmf_remove)
        self.add = None if pld._symmetric else _RunningPMF(pld._pmf_add)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached arrays."""
        return sum(pmf.nbytes for pmf in (self.remove, self.add) if pmf is not None)

    @property
    def version(self) -> int:
        """Changes whenever a cached array is (re)allocated."""
        return self.remove.version + (self.add.version if self.add is not None else 0)

    def epsilon(self, steps: int, delta: float) -> float:
        """Epsilon at ``delta`` after ``steps`` >= 1 steps (the larger over both neighbour
        directions, as dp-accounting's ``get_epsilon_for_delta``)."""
        return max(self.directions(steps, delta))

    def directions(self, steps: int, delta: float,
                   bounds: tuple[float, float] = (math.inf, math.inf)) -> tuple[float, float]:
        """(remove, add) epsilons at ``delta`` after ``steps`` steps, given upper ``bounds`` on
        each (the values at a nested coarser discretisation, :func:`dp.analysis.pld.epsilon`).
        The direction with the larger bound is computed first; the other is computed unless its
        bound is at least ``SKIP_GAP`` below that value, else its bound is returned in its place.
        Either way the larger of the two is the exact larger of both directions (docs/privacy.md,
        section 7)."""
        if self.add is None:
            value = self.remove.epsilon(steps, delta)
            return value, value
        pmfs, values = (self.remove, self.add), list(bounds)
        first = 0 if bounds[0] >= bounds[1] else 1
        values[first] = pmfs[first].epsilon(steps, delta)
        if bounds[1 - first] + SKIP_GAP > values[first]:
            values[1 - first] = pmfs[1 - first].epsilon(steps, delta)
        return values[0], values[1]


_ENGINES: OrderedDict[tuple[float, float, float], RunningPLD] = OrderedDict()


def running_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                    discretisation: float) -> float:
    """Epsilon of ``steps`` subsampled Gaussian steps from the cached engine for these parameters."""
    return max(running_directions(noise_multiplier, sample_rate, steps, delta, discretisation))


def running_directions(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                       discretisation: float,
                       bounds: tuple[float, float] = (math.inf, math.inf)) -> tuple[float, float]:
    """:meth:`RunningPLD.directions` of the cached engine for these parameters."""
    key = (float(noise_multiplier), float(sample_rate), float(discretisation))
    engine = _ENGINES.pop(key, None)
    held = None if engine is None else engine.version
    if engine is None:
        engine = RunningPLD(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                            discretisation=discretisation)
    _ENGINES[key] = engine
    value = engine.directions(steps, delta, bounds)
    if engine.version != held:  # arrays were (re)allocated: drop the least recently used
        while len(_ENGINES) > 1 and (len(_ENGINES) > CACHE_SIZE
                                     or sum(e.nbytes for e in _ENGINES.values()) > CACHE_BYTES):
            _ENGINES.popitem(last=False)
    return value
