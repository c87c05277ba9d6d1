"""The q = 1 PLD (central client-level noise) built in numpy (:mod:`dp.analysis.pld_gaussian`)
against dp-accounting's own construction: the same PMF arrays bit for bit, and an epsilon never
below dp-accounting's and within the scan's proven margin (``scan_margin``) above it.

The adversary here is the accountant's own arithmetic: a reported epsilon below dp-accounting's
would claim more privacy than its pessimistic PLD proves. The tests compare on the benchmark's
central cases, tiny and huge noise, and a hypothesis search over (standard deviation,
discretisation, delta) for any case where the two differ."""

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf, pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as plds
from fedsec.dp.analysis import pld, pld_gaussian
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.ledger import GaussianEvent
from hypothesis import given, settings
from hypothesis import strategies as st

DELTAS = (1e-2, 1e-5, 1e-8, 1e-12)
COARSE = pld.discretisations()[:3]  # 1e-2, 10^-2.5, 1e-3


def _reference_pmf(standard_deviation, d):
    """What ``PLDAccountant`` holds after one Gaussian event: identity composed with it."""
    composed = plds.identity(d).compose(
        plds.from_gaussian_mechanism(standard_deviation=standard_deviation, value_discretization_interval=d))
    return composed._pmf_remove


def _assert_same_pmf(standard_deviation, d):
    reference = _reference_pmf(standard_deviation, d)
    lower, probs, infinity = pld_gaussian.gaussian_pmf(standard_deviation, d)
    assert pld_gaussian.grid_size(standard_deviation, d) == probs.size
    if probs.size <= pld_gaussian.SPARSE_SIZE:  # before the identity's composition (which dp-accounting does)
        reference = plds.from_gaussian_mechanism(
            standard_deviation=standard_deviation, value_discretization_interval=d)._pmf_remove
        assert isinstance(reference, pld_pmf.SparsePLDPmf)
        keys = sorted(reference._loss_probs)
        assert keys == list(range(lower, lower + probs.size))
        np.testing.assert_array_equal([reference._loss_probs[k] for k in keys], probs)
        assert reference._infinity_mass == infinity
        return
    lower, probs, infinity = pld_gaussian.composed_with_identity(lower, probs, infinity)
    assert isinstance(reference, pld_pmf.DensePLDPmf)
    assert reference._lower_loss == lower
    np.testing.assert_array_equal(reference._probs, probs)
    assert reference._infinity_mass == infinity


def _assert_never_below_and_close(value, reference, standard_deviation, d):
    """``value`` is in [reference, reference + 2 margins]: the scan's documented tolerance."""
    lower, probs, infinity = pld_gaussian.gaussian_pmf(standard_deviation, d)
    if probs.size <= pld_gaussian.SPARSE_SIZE:
        assert value == reference  # dp-accounting's own sparse computation
        return
    upper_loss = (lower + probs.size - 1) * d
    margin = pld_gaussian.scan_margin(reference, upper_loss, probs.size, d)
    assert reference <= value <= reference + 2 * margin
    assert margin <= pld_gaussian.margin_bound(standard_deviation, d)
    assert value - reference <= 1e-9


@pytest.mark.parametrize("sigma,steps", [(1.0, 10), (1.0, 100), (1.0, 1000), (5.0, 10), (5.0, 100),
                                         (5.0, 1000), (0.5, 1), (3.0, 7)])
@pytest.mark.parametrize("d", COARSE[:2])
def test_the_benchmark_cases_are_dp_accountings_pmf_and_epsilon(sigma, steps, d):
    _assert_same_pmf(sigma / math.sqrt(steps), d)
    event = GaussianEvent(sigma, 1.0, steps)
    for delta in DELTAS:
        _assert_never_below_and_close(pld_gaussian.gaussian_epsilon(sigma, steps, delta, d),
                                      pld.epsilon_at_from_scratch([event], delta, d),
                                      sigma / math.sqrt(steps), d)


@pytest.mark.parametrize("standard_deviation,d", [
    (0.02, 1e-2),     # tiny noise: a 350,000-point grid, epsilon in the thousands
    (0.5, 1e-4),      # a fine discretisation: 130,000 points
    (20.0, 1e-4),     # huge noise: 5,000 points near loss 0
    (200.0, 1e-4),    # 300 points: dp-accounting's sparse PMF
    (1e4, 1e-2),      # one grid point
])
def test_tiny_and_huge_noise_are_dp_accountings(standard_deviation, d):
    _assert_same_pmf(standard_deviation, d)
    for delta in DELTAS:
        reference = pld.epsilon_at_from_scratch([GaussianEvent(standard_deviation, 1.0, 1)], delta, d)
        _assert_never_below_and_close(pld_gaussian.gaussian_epsilon(standard_deviation, 1, delta, d),
                                      reference, standard_deviation, d)


@settings(max_examples=20, deadline=None)
@given(log_sd=st.floats(math.log(0.05), math.log(50.0)), level=st.integers(0, 2),
       log_delta=st.floats(math.log(1e-14), math.log(0.5)))
def test_no_searched_case_is_below_dp_accounting(log_sd, level, log_delta):
    standard_deviation, d, delta = math.exp(log_sd), COARSE[level], math.exp(log_delta)
    _assert_same_pmf(standard_deviation, d)
    reference = pld.epsilon_at_from_scratch([GaussianEvent(standard_deviation, 1.0, 1)], delta, d)
    _assert_never_below_and_close(pld_gaussian.gaussian_epsilon(standard_deviation, 1, delta, d),
                                  reference, standard_deviation, d)


@pytest.mark.parametrize("sigma,steps,delta", [(1.0, 1000, 1e-5), (5.0, 100, 1e-5), (1.0, 10, 1e-9),
                                               (40.0, 3, 1e-5)])
def test_the_refinement_reports_the_from_scratch_value(sigma, steps, delta):
    events = [GaussianEvent(sigma, 1.0, steps)]
    reference = pld.epsilon(events, delta, from_scratch=True)
    assert reference <= pld.epsilon(events, delta) <= reference + 1e-9


def test_a_q1_ledger_is_not_handed_to_dp_accountings_accountant(monkeypatch):
    expected = pld.epsilon_at_from_scratch([GaussianEvent(1.0, 1.0, 1000)], 1e-5, 1e-2)

    def refuse(*args, **kwargs):
        raise AssertionError("dp-accounting's accountant was called")

    monkeypatch.setattr(pld_privacy_accountant, "PLDAccountant", refuse)
    assert expected <= pld.epsilon_at([GaussianEvent(1.0, 1.0, 1000)], 1e-5, 1e-2) <= expected + 1e-9
    assert expected == pytest.approx(633.93, abs=0.01)
    with pytest.raises(AssertionError):
        pld.epsilon_at_from_scratch([GaussianEvent(1.0, 1.0, 1000)], 1e-5, 1e-2)


def test_a_zero_noise_multiplier_has_no_finite_epsilon():
    assert pld_gaussian.gaussian_epsilon(0.0, 10, 1e-5, 1e-2) == math.inf


@pytest.mark.parametrize("standard_deviation,d", [(0.0, 1e-2), (-1.0, 1e-2), (math.nan, 1e-2),
                                                  (math.inf, 1e-2), (1.0, 0.0), (1.0, -1e-3),
                                                  (1.0, math.nan)])
def test_bad_parameters_are_refused_with_a_typed_error(standard_deviation, d):
    with pytest.raises(InvalidPrivacyParameterError):
        pld_gaussian.gaussian_pmf(standard_deviation, d)
