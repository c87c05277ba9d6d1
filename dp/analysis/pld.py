"""Privacy loss distributions (dp-accounting's PLD accountant, Doroshenko et al. 2022).

Pessimistic estimates (the default of dp-accounting), so every value is an upper bound on the
exact epsilon. The value discretisation is chosen from the regime: starting at 1e-2, it is
refined by a factor of sqrt(10) until two successive epsilons agree within 0.001 (``AGREEMENT``),
and the finer of the two is reported. The error of a pessimistic PLD shrinks about in proportion
to the discretisation, so when two successive values differ by at most 0.001 the finer one is
within about 0.001 / (sqrt(10) - 1) < 0.0005 of the exact value. A fixed 1e-3 was 0.013 too high
at q = 0.01, sigma = 4, 10,000 steps (0.960 against 0.947), and needlessly fine where the
distribution is smooth. Refinement stops at ``FINEST`` (1e-5) and reports that value, still an
upper bound, if the values never agreed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from fedsec.dp.analysis.pld_gaussian import gaussian_epsilon, margin_bound
from fedsec.dp.analysis.pld_running import running_directions
from fedsec.dp.errors import UnsupportedEventError
from fedsec.dp.ledger import Event, GaussianEvent

COARSEST = 1e-2
FINEST = 1e-5
AGREEMENT = 1e-3
"""Two successive epsilons closer than this end the refinement."""
ROUNDING_ALLOWANCE = 2e-5
"""Relative: the running engine scans at delta less a bound on the FFT's rounding of the tail mass
(:meth:`~dp.analysis.pld_running._RunningPMF.rounding_mass`), which raises its value by at most
1.2e-5 epsilon at delta >= 1e-5 in the regimes measured (docs/privacy.md, section 7); the tests
allow RUNNING_MARGIN twice plus this fraction of epsilon above dp-accounting's value."""
RUNNING_MARGIN = 1e-6
"""Added to the cached engine's value so that it is never below dp-accounting's from-scratch value
(their difference, floating-point rounding of the FFT power and the scan, is below 3e-7 at every
regime tested; tests/dp/test_incremental_accountants.py checks [scratch, scratch + 2e-6])."""


def discretisations() -> list[float]:
    """The value discretisations tried, coarse to fine: 1e-2, 10^-2.5, ..., 1e-5."""
    count = round(2 * math.log10(COARSEST / FINEST)) + 1
    return [COARSEST * 10 ** (-k / 2) for k in range(count)]


def epsilon_at(events: Sequence[Event], delta: float, discretisation: float, *,
               levels: dict[float, tuple[float, float]] | None = None) -> float:
    """Pessimistic PLD epsilon of ``events`` at ``delta`` for one value discretisation.

    A ledger of one subsampled Gaussian event (q < 1), what a run with one cost profile a round
    keeps, goes through the cached :func:`~dp.analysis.pld_running.running_directions`, whose
    cost does not grow with the step count, plus ``RUNNING_MARGIN``; any other ledger through
    dp-accounting from scratch (:func:`epsilon_at_from_scratch`). ``levels`` (discretisation ->
    (remove, add) epsilons, filled in here) lets the running engine skip the neighbour direction
    that a nested discretisation ten times coarser already bounds below the other one. A ledger
    of one unsampled Gaussian event (q = 1, central noise) goes through
    :func:`~dp.analysis.pld_gaussian.gaussian_epsilon`, dp-accounting's construction in numpy
    (bit-for-bit the same PMF; the epsilon never below dp-accounting's and at most two of its
    scan margins above it)."""
    if on_central_gaussian(events):
        event = events[0]
        return gaussian_epsilon(event.noise_multiplier, event.steps, delta, discretisation)
    if on_running_engine(events):
        event = events[0]
        bounds = (math.inf, math.inf)
        for coarser, values in (levels or {}).items():
            if math.isclose(coarser, 10 * discretisation, rel_tol=1e-9):
                bounds = values
        values = running_directions(event.noise_multiplier, event.sample_rate, event.steps, delta,
                                    discretisation, bounds)
        if levels is not None:
            levels[discretisation] = values
        return max(values) + RUNNING_MARGIN
    return epsilon_at_from_scratch(events, delta, discretisation)


def on_central_gaussian(events: Sequence[Event]) -> bool:
    """Whether :func:`epsilon_at` answers ``events`` by :mod:`dp.analysis.pld_gaussian` (one
    unsampled Gaussian event, q = 1: central noise over every client)."""
    return len(events) == 1 and isinstance(events[0], GaussianEvent) and events[0].sample_rate >= 1


def on_running_engine(events: Sequence[Event]) -> bool:
    """Whether :func:`epsilon_at` answers ``events`` from the cached running engine (one
    subsampled Gaussian event, q < 1) rather than dp-accounting from scratch."""
    return len(events) == 1 and isinstance(events[0], GaussianEvent) and events[0].sample_rate < 1


def epsilon_at_from_scratch(events: Sequence[Event], delta: float, discretisation: float) -> float:
    """Pessimistic PLD epsilon of ``events`` at ``delta`` for one value discretisation, composed
    from scratch by dp-accounting's ``PLDAccountant``."""
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretisation)
    for event in events:
        if not isinstance(event, GaussianEvent):
            raise UnsupportedEventError("the PLD accountant covers the subsampled Gaussian only")
        accountant.compose(to_dp_event(event))
    return float(accountant.get_epsilon(delta))


def epsilon(events: Sequence[Event], delta: float, *, from_scratch: bool = False) -> float:
    """Epsilon at ``delta``, refined until two successive discretisations agree (module docstring);
    ``from_scratch`` skips the cached engine (the reference the tests and benchmark compare with).

    A finer discretisation whose value is infinite after a coarser finite one (the running
    engine's rounding bound reached ``delta``: a long run at a very small delta) ends the
    refinement with the smallest finite value found: each level's value bounds the exact
    epsilon from above, so that one does too."""
    for event in events:
        if not isinstance(event, GaussianEvent):
            raise UnsupportedEventError("the PLD accountant covers the subsampled Gaussian only")
    levels: dict[float, tuple[float, float]] = {}
    previous = math.inf
    value = math.inf
    finite: list[float] = []
    for discretisation in discretisations():
        value = (epsilon_at_from_scratch(events, delta, discretisation) if from_scratch
                 else epsilon_at(events, delta, discretisation, levels=levels))
        if math.isinf(value) and finite:
            return min(finite)
        if math.isfinite(value):
            finite.append(value)
        tolerance = AGREEMENT if from_scratch else agreement(events, discretisation, previous, value)
        if abs(previous - value) <= tolerance:
            break
        previous = value
    return value


def agreement(events: Sequence[Event], discretisation: float, previous: float, value: float) -> float:
    """How close two successive levels (``previous`` at the coarser one, ``value`` at
    ``discretisation``) must be to end the refinement of :func:`epsilon_at`'s values:
    ``AGREEMENT``, widened by how far the route ``events`` take may lie above dp-accounting's
    values, so that it never refines past the level where dp-accounting would stop (where it did,
    it reported a finer level's value, up to 1e-4 lower: session-7 review). It may stop one level
    earlier than dp-accounting, reporting a coarser value.

    - the running engine: 2 ``RUNNING_MARGIN`` + ``ROUNDING_ALLOWANCE`` epsilon;
    - central noise (q = 1): two of :mod:`dp.analysis.pld_gaussian`'s scan margins at the finer
      level;
    - dp-accounting itself (any other ledger), or an infinite level: none."""
    if not (math.isfinite(previous) and math.isfinite(value)):
        return AGREEMENT
    if on_running_engine(events):
        return AGREEMENT + 2 * RUNNING_MARGIN + ROUNDING_ALLOWANCE * max(previous, value)
    if on_central_gaussian(events):
        event = events[0]
        return AGREEMENT + 2 * margin_bound(event.noise_multiplier / math.sqrt(event.steps), discretisation)
    return AGREEMENT


def to_dp_event(event: GaussianEvent) -> dp_accounting.DpEvent:
    gaussian = dp_accounting.GaussianDpEvent(event.noise_multiplier)
    single = (gaussian if event.sample_rate >= 1
              else dp_accounting.PoissonSampledDpEvent(event.sample_rate, gaussian))
    return dp_accounting.SelfComposedDpEvent(single, event.steps)
