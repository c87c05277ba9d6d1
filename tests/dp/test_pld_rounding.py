"""The running PLD engine's rounding bound (``_RunningPMF.rounding_mass``): what it sums, and what
it buys: the engine's value is never below the exact composed PMF's, which an exponentially
tilted composition computes without the FFT's absolute rounding in the tail (tests/review/
test_pld_small_delta.py plays the cases the review found)."""

import math

import numpy as np
import pytest
from fedsec.dp.analysis import pld, pld_running
from fedsec.dp.analysis.pld_running import RunningPLD
from fedsec.dp.ledger import GaussianEvent

U = np.finfo(np.float64).eps / 2


def _direct_bound(pmf, steps):
    """The documented bound summed over every coefficient, no floor, no sorting (the sums at the
    rung of T - 1, :func:`pld_running.rounding_anchor`)."""
    lower, upper = pmf.bounds(steps)
    length = upper - lower + 1
    pmf._grid_for(length)
    size, spectrum = pmf.grid
    exponent = max(steps - 1, 0)  # the sums at the exponent's rung (at or below it: a larger bound)
    magnitude = np.abs(spectrum) ** (pld_running.rounding_anchor(exponent) if exponent else 0)
    per = pld_running.ROUNDING_ULPS * U * ((steps + 1) * (math.log2(size) + 1) + max(steps - 1, 0) + 2)
    pointwise = length * 2 * magnitude.sum() / size * per
    in_norm = math.sqrt(length * 2 * (magnitude ** 2).sum() / size) * per
    return min(pointwise, in_norm) + 2 * length * U


@pytest.mark.parametrize("sigma,q,steps,d", [(16.375, 16 / 114, 7000, 1e-3), (1.0, 0.01, 1, 1e-2),
                                             (0.5, 0.001, 300, 1e-2), (2.0, 0.3, 50, 10 ** -2.5),
                                             (1.0, 0.14, 30000, 1e-3)])
def test_the_rounding_bound_is_the_documented_sum(sigma, q, steps, d):
    engine = RunningPLD(noise_multiplier=sigma, sample_rate=q, discretisation=d)
    for pmf in (engine.remove, engine.add):
        if pmf is None:
            continue
        want = _direct_bound(pmf, steps)
        assert pmf.rounding_mass(steps) == pytest.approx(want, rel=1e-9)
        assert want > 2 * U  # never zero: the scan always gives something up


def test_the_engine_scans_at_delta_less_the_bound_and_is_infinite_where_it_reaches_delta():
    engine = RunningPLD(noise_multiplier=0.5112444922992939, sample_rate=0.01, discretisation=0.01)
    pmf = engine.remove
    margin = pmf.rounding_mass(2000)
    assert pmf.epsilon(2000, 1e-5) == pmf.dense_epsilon(2000, 1e-5 - margin) or \
        pmf.epsilon(2000, 1e-5) == pmf.sparse_epsilon(2000, 1e-5 - margin)
    assert pmf.epsilon(2000, 1e-5) >= pmf.dense_epsilon(2000, 1e-5)
    assert math.isinf(pmf.epsilon(2000, margin / 2))


def test_a_refinement_whose_finer_levels_are_infinite_reports_the_smallest_finite_level():
    """sigma 0.8, q = 0.05, 1,000 steps at delta 1e-10: the bound reaches delta on the fine grids,
    so the refinement stops there with its smallest finite value, at or above from scratch."""
    pld_running._ENGINES.clear()
    event = GaussianEvent(0.8, 0.05, 1000)
    levels = [pld.epsilon_at([event], 1e-10, d) for d in pld.discretisations()[:5]]  # 1e-4: inf
    assert any(math.isinf(v) for v in levels) and math.isfinite(levels[0])
    value = pld.epsilon([event], 1e-10)
    finite_before = [v for v in levels[:next(i for i, v in enumerate(levels) if math.isinf(v))]]
    assert value == min(finite_before)
    at = pld.discretisations()[levels.index(value)]
    assert value >= pld.epsilon_at_from_scratch([event], 1e-10, at)


def test_the_rung_is_at_or_below_the_exponent_and_every_integer_up_to_46():
    anchors = [pld_running.rounding_anchor(e) for e in range(1, 20000)]
    assert all(a <= e for e, a in zip(range(1, 20000), anchors, strict=True))
    assert anchors[:46] == list(range(1, 47))
    assert max(e / a for e, a in zip(range(1, 20000), anchors, strict=True)) < 2 ** (1 / 32) + 1e-3
    assert len(set(anchors)) < 400  # rungs, so the sums are computed once a rung
    with pytest.raises(ValueError):
        pld_running.rounding_anchor(0)
