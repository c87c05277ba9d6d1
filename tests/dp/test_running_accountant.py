"""The constant-cost accountant reports the epsilon the from-scratch computation reports.

- A run's sequence of queries (T growing each round, trials one round ahead, a resumed run jumping
  far ahead, a smaller T after a larger one) gives, at every round checked, the from-scratch PLD
  epsilon (dp-accounting composing the whole ledger) to within [0, 2e-6] above it, far inside the 0.001 the
  refinement works to (dp/analysis/pld.py); the refinement stops at the same discretisation.
- The engine's pieces equal dp-accounting's own: the truncation window, the self-composed PMF
  (which also pins the private attributes the engine reads) and the hockey-stick scan.
- The cached RDP equals dp-accounting's ``RdpAccountant`` bit for bit on any Gaussian ledger.
- A PrivacyBudget run over 40 rounds reports, every round, the from-scratch epsilon.
"""

import math

import numpy as np
import pytest
from dp_accounting.pld import common, pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from fedsec.dp.analysis import pld, pld_running, rdp
from fedsec.dp.analysis.pld_running import RunningPLD, epsilon_for_delta
from fedsec.dp.ledger import GaussianEvent
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.privacy import PrivacyBudget
from hypothesis import given, settings
from hypothesis import strategies as st

DELTA = 1e-5
REGIMES = [(1.0, 0.14, 7), (4.0, 0.05, 20), (0.7, 0.3, 3)]


def _scratch(sigma, q, steps, delta=DELTA):
    return pld.epsilon([GaussianEvent(sigma, q, steps)], delta, from_scratch=True)


def _within(value, scratch):
    """The documented tolerance: never below the from-scratch value, at most 2 RUNNING_MARGIN plus
    ROUNDING_ALLOWANCE x scratch above (the FFT rounding bound the engine scans with)."""
    return scratch <= value <= scratch + 2 * pld.RUNNING_MARGIN + pld.ROUNDING_ALLOWANCE * scratch


@pytest.mark.parametrize("sigma,q,per_round", REGIMES)
def test_a_growing_run_reports_the_from_scratch_epsilon(sigma, q, per_round):
    pld_running._ENGINES.clear()
    checked = {1, 2, 7, 40}
    for r in range(1, 41):
        trial = pld.epsilon([GaussianEvent(sigma, q, per_round * (r + 1))], DELTA)  # before_round
        value = pld.epsilon([GaussianEvent(sigma, q, per_round * r)], DELTA)
        if r in checked:
            assert _within(value, _scratch(sigma, q, per_round * r))
            assert _within(trial, _scratch(sigma, q, per_round * (r + 1)))


def test_jumps_and_smaller_step_counts_give_the_from_scratch_epsilon():
    """A resumed run starts far ahead; a trial for a smaller T follows a larger one."""
    pld_running._ENGINES.clear()
    for steps in (5, 900, 3, 4000, 4001, 17):
        assert _within(pld.epsilon([GaussianEvent(2.0, 0.1, steps)], DELTA), _scratch(2.0, 0.1, steps))


def test_the_binary_power_stays_exact_along_a_run(monkeypatch):
    """Every step count of a run from 1 on, at one discretisation (the dense path, which the
    sparse scan falls back to): the value at the end still equals dp-accounting's
    self-composition."""
    monkeypatch.setattr(pld_running, "SPARSE", False)
    engine = RunningPLD(noise_multiplier=1.5, sample_rate=0.2, discretisation=1e-3)
    for steps in range(1, 168):
        engine.epsilon(steps, DELTA)
    steps = 168
    direct = pld_lib.from_gaussian_mechanism(1.5, value_discretization_interval=1e-3, sampling_prob=0.2)
    dense = max(p.dense_epsilon(steps, DELTA) for p in (engine.remove, engine.add) if p is not None)
    # epsilon is 10 here: the FFT length alone moves it by 1e-9 (dp-accounting's own length too)
    assert dense == pytest.approx(
        direct.self_compose(steps).get_epsilon_for_delta(DELTA), abs=1e-9, rel=2e-10)


@pytest.mark.parametrize("steps", [1, 2, 50, 777])
def test_the_window_and_the_pmf_are_dp_accountings(steps):
    dist = pld_lib.from_gaussian_mechanism(1.2, value_discretization_interval=1e-3, sampling_prob=0.1)
    engine = RunningPLD(noise_multiplier=1.2, sample_rate=0.1, discretisation=1e-3)
    for mine, theirs in ((engine.remove, dist._pmf_remove), (engine.add, dist._pmf_add)):
        dense = theirs.to_dense_pmf()
        assert mine.bounds(steps) == common.compute_self_convolve_bounds(
            dense._probs, steps, pld_running.TAIL_MASS)
        lower, probs, infinity = mine.composed(steps)
        want = dense.self_compose(steps)
        assert lower == want._lower_loss
        assert infinity == want._infinity_mass
        assert probs.shape == want._probs.shape
        assert np.abs(probs - want._probs).max() < 1e-14


@given(size=st.integers(1, 9000), lower=st.integers(-3000, 3000),
       discretisation=st.sampled_from([1e-4, 1e-3, 1e-2, 0.1]),
       infinity=st.sampled_from([0.0, 1e-12, 1e-6]), delta=st.sampled_from([1e-8, 1e-5, 1e-2, 0.3]),
       seed=st.integers(0, 2**16))
@settings(max_examples=60)
def test_the_hockey_stick_scan_equals_dp_accountings_loop(size, lower, discretisation, infinity, delta,
                                                          seed):
    rng = np.random.default_rng(seed)
    probs = rng.exponential(size=size) * rng.random(size) ** 8
    probs *= (1 - infinity) / probs.sum()
    dense = pld_pmf.DensePLDPmf(discretisation, lower, probs.copy(), infinity, True)
    want = dense.get_epsilon_for_delta(delta)
    got = epsilon_for_delta(infinity, lower, discretisation, probs, delta)
    if math.isinf(want):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


gaussian_events = st.builds(
    GaussianEvent, st.sampled_from([0.5, 0.8, 1.0, 2.5, 7.0]),
    st.sampled_from([0.001, 0.01, 0.14, 0.5, 1.0]), st.integers(1, 5000))


@given(events=st.lists(gaussian_events, min_size=1, max_size=4),
       delta=st.sampled_from([1e-9, 1e-5, 1e-2]))
@settings(max_examples=12)
def test_the_cached_rdp_is_dp_accountings_bit_for_bit(events, delta):
    assert rdp.epsilon(events, delta) == rdp.epsilon(events, delta, from_scratch=True)


def test_a_budget_reports_the_from_scratch_epsilon_every_round():
    pld_running._ENGINES.clear()
    event = GaussianEvent(1.3, 0.08, 12)
    budget = PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=1e9, accountant="pld",
                           unit="example", noise_multiplier=event.noise_multiplier)
    for r in range(1, 41):
        assert budget.before_round(r) is None
        budget.charge(r)
        record = RoundRecord(round=r, accuracy=0.0, loss=0.0, train_loss=0.0, participants=1,
                             dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.0)
        budget.after_round(record)
        if r % 13 == 1:
            ledger = [GaussianEvent(1.3, 0.08, 12 * r)]
            assert _within(record.metrics["epsilon"], pld.epsilon(ledger, DELTA, from_scratch=True))
            assert record.metrics["epsilon_rdp"] == rdp.epsilon(ledger, DELTA, from_scratch=True)


def test_the_engine_cache_stays_within_its_memory(monkeypatch):
    """A calibration tries many sigmas: the cache drops the least recently used engines once they
    hold more than CACHE_BYTES, and still answers exactly."""
    pld_running._ENGINES.clear()
    monkeypatch.setattr(pld_running, "CACHE_BYTES", 2 * 2**20)
    for sigma in (0.9, 1.1, 1.3, 1.7, 2.3):
        value = pld_running.running_epsilon(sigma, 0.1, 300, DELTA, 1e-4)
        assert sum(e.nbytes for e in pld_running._ENGINES.values()) <= 2 * 2**20 or len(
            pld_running._ENGINES) == 1
    assert list(pld_running._ENGINES)[-1] == (2.3, 0.1, 1e-4)
    direct = pld_lib.from_gaussian_mechanism(2.3, value_discretization_interval=1e-4, sampling_prob=0.1)
    want = direct.self_compose(300).get_epsilon_for_delta(DELTA)
    assert want - 1e-9 <= value <= want * (1 + pld.ROUNDING_ALLOWANCE) + 1e-9  # the rounding margin
