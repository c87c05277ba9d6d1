"""dp-accounting's PLD epsilon of T unsampled Gaussian steps (q = 1), built in numpy.

Central client-level noise is one Gaussian release a round, q = 1. T such steps with noise
multiplier sigma are one Gaussian of standard deviation sigma / sqrt(T), so dp-accounting's
``PLDAccountant`` builds ``from_gaussian_mechanism(sigma / sqrt(T), d)`` once and does not
self-compose; but it builds it element by element in Python over a loss grid of
(epsilon_upper - epsilon_lower) / d points (about 2 * 10.2 / s + 1 / s^2 nats wide, s the
standard deviation: 650,000 points at s = 1 / sqrt(1000), d = 1e-4), 0.4 s a round at round
1,000 over the refinement of :mod:`dp.analysis.pld`.

:func:`gaussian_epsilon` follows the same steps, in the same order, as numpy array operations:

1. ``GaussianPrivacyLoss`` (REMOVE adjacency, sensitivity 1, log mass truncation bound -50):
   the truncation points ``norm(scale=s).ppf(0.5 * e^-50)`` shifted by the sensitivity, the
   connect-the-dots bounds (the privacy loss at each), rounded out to the grid of step ``d``;
2. ``get_delta_for_epsilon`` at every grid loss: the inverse privacy loss (the same float
   expression, evaluated on the array instead of a list comprehension), then
   ``cdf(x + 1) - exp(eps + logcdf(x))`` (REMOVE: the upper
   distribution is the noise shifted by -1, the lower the noise) and the clip to [0, 1];
3. ``create_pmf_pessimistic_connect_dots_fixed_gap``: the monotonicity check, the running
   minimum, the connect-the-dots masses, the infinity mass ``delta_n``;
4. the accountant's composition with the identity PLD: ``scipy.signal.fftconvolve`` of ``[1]``
   with the masses (the same call, so the same rounding) and ``_truncate_tails`` at tail mass
   1e-15 (its sequential prefix sums as ``np.cumsum``, the same order of additions);
5. ``get_epsilon_for_delta`` by :func:`~dp.analysis.pld_running.epsilon_for_delta`, plus
   :func:`scan_margin`.

Steps 1-4 are the same floating-point operations on the same operands, so the PMF is bit-for-bit
dp-accounting's (the tests compare the arrays). The scan's factors exp(-loss) come from numpy's
vectorised exp, which differs from libm's ``math.exp`` in the last bit at about 5 % of the points,
so the scan's value may differ from dp-accounting's by a few ulps (2e-16 measured);
:func:`scan_margin` adds a proven bound on that difference, 2.02 (k + 4) 2^-53 for k grid points
above epsilon (3e-11 at sigma = 1, T = 1,000, d = 10^-2.5), so the value is never below
dp-accounting's and at most twice the margin above it. Grids of at most 1,000 points
(dp-accounting's sparse PMF, a huge sigma / sqrt(T)), and a noise multiplier of 0, are handed to
dp-accounting itself: they are cheap there and its sparse scan sums in another order.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
from dp_accounting.pld import pld_pmf, pld_privacy_accountant
from fedsec.dp.analysis.pld_running import epsilon_for_delta
from fedsec.dp.errors import InvalidPrivacyParameterError
from scipy import signal, stats

LOG_MASS_TRUNCATION_BOUND = -50.0
"""dp-accounting's default for ``from_gaussian_mechanism``: ln of the noise mass left out."""
TAIL_MASS_TRUNCATION = 1e-15
"""dp-accounting's default for ``PrivacyLossDistribution.compose`` (the identity composition)."""
SPARSE_SIZE = 1000
"""dp-accounting's ``_MAX_PMF_SPARSE_SIZE``: grids this small stay sparse there."""


def gaussian_pmf(standard_deviation: float, discretisation: float) -> tuple[int, np.ndarray, float]:
    """dp-accounting's pessimistic connect-the-dots PMF of the Gaussian mechanism (sensitivity 1,
    q = 1) as (lowest loss index, masses, infinity mass): the loss of ``probs[i]`` is
    ``(lower + i) * discretisation`` nats. ``standard_deviation`` > 0; ``discretisation`` > 0."""
    if not (math.isfinite(standard_deviation) and standard_deviation > 0):
        raise InvalidPrivacyParameterError(
            f"standard deviation must be a finite number > 0, got {standard_deviation}")
    if not (math.isfinite(discretisation) and discretisation > 0):
        raise InvalidPrivacyParameterError(
            f"discretisation must be a finite number > 0, got {discretisation}")
    noise = stats.norm(scale=standard_deviation)
    variance = standard_deviation ** 2
    lower_x = noise.ppf(0.5 * math.exp(LOG_MASS_TRUNCATION_BOUND))
    upper_x = -lower_x
    lower_x -= 1
    epsilon_upper = 1 * (-0.5 * 1 - lower_x) / variance
    epsilon_lower = 1 * (-0.5 * 1 - upper_x) / variance
    rounded_upper = math.ceil(epsilon_upper / discretisation)
    rounded_lower = math.floor(epsilon_lower / discretisation)
    epsilons = np.arange(rounded_lower, rounded_upper + 1) * discretisation
    cutoffs = -0.5 * 1 - epsilons * variance / 1
    deltas = noise.cdf(np.add(cutoffs, 1)) - np.exp(epsilons + noise.logcdf(cutoffs))
    deltas = np.clip(deltas, 0, 1)
    if rounded_lower == rounded_upper:
        return rounded_lower, np.array([1 - deltas[0]]), float(deltas[0])
    if np.any(np.diff(deltas) > pld_pmf._DELTA_DIFF_TOLERANCE):
        raise ValueError("deltas are not in non-increasing order")
    deltas = np.minimum.accumulate(deltas)
    diffs = np.diff(deltas)
    probs = np.zeros_like(deltas)
    probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(discretisation)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(discretisation)) / math.expm1(discretisation)
    probs[-1] = diffs[-1] / math.expm1(-discretisation)
    probs = np.maximum(0.0, probs)
    return rounded_lower, probs, float(deltas[-1])


def _prefix_to_truncate(probs: np.ndarray, threshold: float) -> int:
    """dp-accounting's ``_find_prefix_to_truncate``: the first index whose running sum (summed
    left to right) exceeds ``threshold``, or the length."""
    above = np.cumsum(probs) > threshold
    return int(np.argmax(above)) if above.any() else probs.size


def composed_with_identity(lower: int, probs: np.ndarray, infinity: float) -> tuple[int, np.ndarray, float]:
    """The PMF after ``PLDAccountant``'s composition of the identity PLD with it: the FFT
    convolution with ``[1]`` and the tail truncation at 1e-15 (pessimistic: the left tail's mass
    onto the first kept loss, the right tail's to infinity)."""
    convolved = signal.fftconvolve(np.array([1]), probs)
    threshold = TAIL_MASS_TRUNCATION / 2
    left = _prefix_to_truncate(convolved, threshold)
    right = convolved.size - _prefix_to_truncate(np.flip(convolved), threshold)
    right = max(right, left + 1)
    left_mass = np.sum(convolved[:left])
    right_mass = np.sum(convolved[right:])
    kept = convolved[left:right]
    kept[0] += left_mass
    return lower + left, kept, float(0 + infinity - 0 * infinity + right_mass)


def scan_margin(epsilon: float, upper_loss: float, size: int, discretisation: float) -> float:
    """An upper bound (nats) on how far :func:`~dp.analysis.pld_running.epsilon_for_delta`'s value
    can fall below dp-accounting's scan of the same PMF: 2.02 (k + 4) u, u = 2^-53, k the number
    of grid points at or above ``epsilon`` (those the scan reads; at most ``size``).

    The two scans add the same masses in the same order; only the factors exp(-loss) differ (numpy's
    vectorised exp against libm's, each within one ulp of exp, so within 4u of each other). Each
    computed lower mass is within (k + 3) u of the exact sum of exact products (k positive terms,
    one rounding for the product, the standard bound on a sequential sum), so the two differ by at
    most 2 (k + 3) u relatively, and epsilon = log((upper - delta) / lower) by at most that in
    nats (first order; 1 % and one more u for the second). Where the scan stops is continuous in
    these masses (at the boundary the next point leaves the ratio unchanged), so this bounds the
    difference of the values, not only of the masses."""
    if not math.isfinite(epsilon):
        return 0.0
    consumed = min(size, math.floor(max(upper_loss - epsilon, 0.0) / discretisation) + 2)
    return 2.02 * (consumed + 4) * 2.0 ** -53


def grid_size(standard_deviation: float, discretisation: float) -> int:
    """The number of finite losses in :func:`gaussian_pmf`'s grid (before the tail truncation)."""
    lower_x = stats.norm(scale=standard_deviation).ppf(0.5 * math.exp(LOG_MASS_TRUNCATION_BOUND))
    variance = standard_deviation ** 2
    epsilon_upper = 1 * (-0.5 * 1 - (lower_x - 1)) / variance
    epsilon_lower = 1 * (-0.5 * 1 + lower_x) / variance
    return math.ceil(epsilon_upper / discretisation) - math.floor(epsilon_lower / discretisation) + 1


def margin_bound(standard_deviation: float, discretisation: float) -> float:
    """:func:`scan_margin` with every grid point read: a bound (nats) on the margin that
    :func:`gaussian_epsilon` adds at this level, whatever delta."""
    return 2.02 * (grid_size(standard_deviation, discretisation) + 4) * 2.0 ** -53


def gaussian_epsilon(noise_multiplier: float, steps: int, delta: float, discretisation: float) -> float:
    """dp-accounting's ``PLDAccountant(d).compose(SelfComposed(Gaussian(sigma), T)).get_epsilon``
    at ``delta`` (nats), never below it and above it by at most :func:`scan_margin`: ``steps`` >= 1
    unsampled Gaussian releases of noise multiplier ``noise_multiplier`` (> 0) at value
    discretisation ``discretisation`` (nats)."""
    if noise_multiplier == 0:
        return math.inf
    standard_deviation = noise_multiplier / math.sqrt(steps)
    lower, probs, infinity = gaussian_pmf(standard_deviation, discretisation)
    if probs.size <= SPARSE_SIZE:
        return _dp_accounting_epsilon(noise_multiplier, steps, delta, discretisation)
    lower, probs, infinity = composed_with_identity(lower, probs, infinity)
    value = float(epsilon_for_delta(infinity, lower, discretisation, probs, delta))
    upper_loss = (lower + probs.size - 1) * discretisation
    return value + scan_margin(value, upper_loss, probs.size, discretisation)


def _dp_accounting_epsilon(noise_multiplier: float, steps: int, delta: float, discretisation: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretisation)
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    accountant.compose(dp_accounting.SelfComposedDpEvent(gaussian, steps))
    return float(accountant.get_epsilon(delta))
