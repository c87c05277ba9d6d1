"""The sparse PRV composition (dp/analysis/prv_spectral.py) against Opacus' dense one.

The adversary here is a ledger: whoever configures a run picks sigma, q and the steps, and a
ledger on which the fast path reported less than Opacus' from-scratch value would under-state
what the data owners lose. The properties below search such ledgers (hypothesis over sigma, q
and step counts, large epsilon included) against the unmodified Opacus computation: the closed
forms equal Opacus' dense sums, the search equals Opacus' ``compute_epsilon``, and the reported
value is in [Opacus, Opacus + 2 MARGIN] (docs/privacy.md section 7).
"""

import warnings

import numpy as np
import pytest
from fedsec.dp import Accountant
from fedsec.dp.analysis import prv, prv_discretise, prv_running, prv_spectral
from fedsec.dp.ledger import GaussianEvent
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.privacy import PrivacyBudget
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV

DELTA = 1e-5
DELTA_ERROR = DELTA / 1000
TOLERANCE = 2 * prv_running.MARGIN

sigmas = st.floats(0.4, 2.0)
rates = st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.5, 1.0])


def _dense(sigma: float, q: float, steps: int) -> prv_running._Bucket:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return prv_running._Bucket(PoissonSubsampledGaussianPRV(q, sigma), prv_running.bucket(steps),
                                   DELTA_ERROR, sparse=False)


def _scratch(events):
    return prv.epsilon(events, DELTA, from_scratch=True)


@given(sigma=sigmas, q=rates, steps=st.integers(1, 20))
@settings(max_examples=12, deadline=None)
def test_the_sparse_search_is_opacus_compute_epsilon_on_the_same_pmf(sigma, q, steps):
    """Same bucket, same one-step PMF: the sparse search against Opacus' own compute_epsilon over
    the dense composed PMF, to 1e-9 relative (the sums differ in rounding only)."""
    part = _dense(sigma, q, steps)
    sparse = prv_spectral.SparseComposition(spectrum=part.spectrum, size=part.size, low_steps=steps)
    shift, domain = part.placement(steps)
    mine = sparse.epsilon(steps, shift, domain.t_min, domain.dt, DELTA - DELTA_ERROR) + prv_running.EPS_ERROR
    opacus = part.composed(steps).compute_epsilon(DELTA, DELTA_ERROR, prv_running.EPS_ERROR)[2]
    assert mine == pytest.approx(opacus, rel=1e-9, abs=1e-9)


@given(sigma=sigmas, q=rates, steps=st.integers(1, 20), where=st.lists(st.floats(0, 1), min_size=1,
                                                                         max_size=8))
@settings(max_examples=12, deadline=None)
def test_the_closed_form_suffix_sums_are_the_dense_cumulative_sums(sigma, q, steps, where):
    """d1(i) = sum_{m >= i} p_m and E2(i) = sum_{m >= i} p_m exp(t_i - t_m) of the rolled composed
    PMF, at any index, against the sums over Opacus' dense PMF."""
    part = _dense(sigma, q, steps)
    sparse = prv_spectral.SparseComposition(spectrum=part.spectrum, size=part.size, low_steps=steps)
    shift, domain = part.placement(steps)
    pmf = part.composed(steps).pmf
    index = np.array([min(int(w * part.size), part.size - 1) for w in where])
    d1, e2 = sparse._sums(sparse._rolled(steps, shift), index, domain.dt)
    ratio = np.exp(-domain.dt)
    for i, got1, got2 in zip(index, d1, e2):
        tail = pmf[i:]
        assert got1 == pytest.approx(tail.sum(), abs=1e-12)
        assert got2 == pytest.approx(np.dot(tail, ratio ** np.arange(tail.size)), abs=1e-12)


def test_dropping_a_coefficient_that_matters_is_caught():
    """Control: the comparison above sees a kept coefficient left out (the first harmonic)."""
    part = _dense(0.7, 0.5, 12)
    kept = prv_spectral.kept_frequencies(part.spectrum, 12)
    assert 1 in kept
    shift, domain = part.placement(12)
    target = DELTA - DELTA_ERROR
    full = prv_spectral.SparseComposition(spectrum=part.spectrum, size=part.size, low_steps=12)
    short = prv_spectral.SparseComposition(spectrum=part.spectrum, size=part.size, low_steps=12,
                                           frequencies=kept[kept != 1])
    assert abs(full.epsilon(12, shift, domain.t_min, domain.dt, target)
               - short.epsilon(12, shift, domain.t_min, domain.dt, target)) > 1e-3


@given(sigma=sigmas, q=rates, low=st.integers(1, 60), more=st.integers(0, 60))
@settings(max_examples=10, deadline=None)
def test_every_dropped_coefficient_stays_below_tau_for_every_larger_step_count(sigma, q, low, more):
    part = _dense(sigma, q, low + more)
    kept = prv_spectral.kept_frequencies(part.spectrum, low)
    dropped = np.setdiff1d(np.arange(part.spectrum.size), kept)
    assert np.all(np.abs(part.spectrum[dropped]) ** (low + more) <= prv_spectral.TAU)
    assert 0 in kept


@pytest.mark.parametrize("sigma,q,counts", [
    (0.5, 1.0, (3, 4, 5, 20, 21, 9)),        # epsilon 30-80
    (0.8, 0.5, (8, 9, 30, 31, 12)),          # epsilon 15-35
    (1.0, 0.1, (200, 201, 230, 120))])       # epsilon 10-12, the sparse path from T ~ 100
def test_a_large_epsilon_run_takes_the_sparse_path_and_stays_within_the_tolerance(sigma, q, counts):
    prv_running._ENGINES.clear()
    used = []
    for steps in counts:
        event = GaussianEvent(sigma, q, steps)
        value = prv.epsilon([event], DELTA)
        used.append(prv_running._ENGINES[(sigma, q, DELTA)].current.sparse is not None)
        scratch = _scratch([event])
        assert scratch <= value <= scratch + TOLERANCE
    assert any(used)


@given(ledger=st.lists(st.builds(GaussianEvent, st.sampled_from([0.5, 0.7, 1.0]),
                                 st.sampled_from([0.1, 0.5, 1.0]), st.integers(1, 8)),
                       min_size=1, max_size=3))
@settings(max_examples=5, deadline=None)
def test_a_large_epsilon_ledger_recorded_event_by_event_is_at_opacus_or_a_little_above(ledger):
    """Mixed (sigma, q, steps) ledgers with epsilon up to about 100, one event at a time (equal
    consecutive mechanisms merge into one growing event, as in a run)."""
    prv_running._ENGINES.clear()
    accountant = Accountant("prv")
    for event in ledger:
        accountant.record(event)
        scratch = _scratch(list(accountant.ledger.events))
        assert scratch <= accountant.get_epsilon(DELTA) <= scratch + TOLERANCE


def _run(budget, rounds, start=1):
    records = []
    for r in range(start, start + rounds):
        if budget.before_round(r):
            break
        budget.charge(r)
        record = RoundRecord(round=r, accuracy=0.0, loss=0.0, train_loss=0.0, participants=1,
                             dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.0)
        budget.after_round(record)
        records.append(record)
    return records


def test_a_large_target_budget_still_stops_before_the_target():
    """Central client-level noise at sigma 0.6 over every client (q = 1), target epsilon 40: the
    last round's from-scratch epsilon is within the target and the next one's is not."""
    prv_running._ENGINES.clear()
    event = GaussianEvent(0.6, 1.0, 1)
    budget = PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=40.0, accountant="prv",
                           unit="client", noise_multiplier=0.6)
    records = _run(budget, 60)
    done = len(records)
    assert budget.stopped is not None and 0 < done < 60
    assert prv_running._ENGINES[(0.6, 1.0, DELTA)].current.sparse is not None
    assert records[-1].metrics["epsilon"] <= 40.0
    assert _scratch([GaussianEvent(0.6, 1.0, done)]) <= 40.0
    assert _scratch([GaussianEvent(0.6, 1.0, done + 1)]) + TOLERANCE > 40.0


def test_a_resumed_large_epsilon_budget_rebuilds_the_same_epsilon():
    """Checkpoint after round 6, every engine dropped (a fresh process), resumed: rounds 7-10 give
    the uninterrupted run's epsilons (bit for bit: a sparse bucket keeps no running state), above
    Opacus' from-scratch value."""
    event = GaussianEvent(0.7, 0.5, 3)

    def budget():
        return PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=0.0, accountant="prv",
                             unit="example", noise_multiplier=0.7)

    prv_running._ENGINES.clear()
    straight = budget()
    _run(straight, 6)
    state = straight.state_dict()
    whole = _run(straight, 4, start=7)
    prv_running._ENGINES.clear()
    resumed = budget()
    resumed.load_state_dict(state)
    again = _run(resumed, 4, start=7)
    assert prv_running._ENGINES[(0.7, 0.5, DELTA)].current.sparse is not None
    assert [r.metrics["epsilon"] for r in again] == [r.metrics["epsilon"] for r in whole]
    assert again[-1].metrics["epsilon"] >= _scratch([GaussianEvent(0.7, 0.5, 30)])


@given(sigma=st.floats(0.3, 20.0), q=st.sampled_from([0.001, 0.01, 16 / 114, 0.5, 1.0]),
       steps=st.integers(1, 200_000))
@settings(max_examples=10, deadline=None)
def test_the_cached_rdp_gives_opacus_safe_domain_size_exactly(sigma, q, steps):
    """A bucket's domain from the one-step RDP cached per engine equals Opacus'
    compute_safe_domain_size bit for bit (which also pins the private RDP function it calls)."""
    from opacus.accountants.analysis.prv import compute_safe_domain_size

    one = PoissonSubsampledGaussianPRV(q, sigma)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = compute_safe_domain_size(prvs=[one], max_self_compositions=[steps],
                                            eps_error=prv_running.EPS_ERROR, delta_error=DELTA_ERROR)
    assert prv_running.safe_domain_size(prv_running.one_step_rdp(one), steps, DELTA_ERROR) == expected


@given(sigma=st.floats(0.5, 50.0), q=st.sampled_from([0.001, 0.01, 0.1, 16 / 114, 0.5, 1.0]),
       top=st.integers(1, 50))
@settings(max_examples=8, deadline=None)
def test_the_banded_discretisation_is_opacus_discretize_bit_for_bit(sigma, q, top):
    """The one-step PMF computed on its non-zero band only equals Opacus' discretize over the
    whole domain, every value, and the mean-shifted domain too."""
    from opacus.accountants.analysis.prv import Domain, TruncatedPrivacyRandomVariable, discretize

    one = PoissonSubsampledGaussianPRV(q, sigma)
    half = prv_running.safe_domain_size(prv_running.one_step_rdp(one), top, DELTA_ERROR)
    mesh = prv_running.EPS_ERROR / np.sqrt(top * np.log(12 / DELTA_ERROR) / 2)
    domain = Domain.create_aligned(-half, half, mesh)
    truncated = TruncatedPrivacyRandomVariable(one, domain.t_min, domain.t_max)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            expected = discretize(truncated, domain)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                prv_discretise.discretise(truncated, domain)
            return
        got = prv_discretise.discretise(truncated, domain)
    assert np.array_equal(got.pmf, expected.pmf)
    assert got.domain == expected.domain


@given(sigma=sigmas, q=rates, steps=st.integers(1, 20), where=st.floats(0, 1))
@settings(max_examples=12, deadline=None)
def test_any_hint_gives_the_same_search_result_dense_and_sparse(sigma, q, steps, where):
    """The last round's index only brackets the search: any index as the hint (here anywhere in
    the domain) gives Opacus' compute_epsilon (dense, bit for bit) and the unhinted sparse value."""
    part = _dense(sigma, q, steps)
    hint = min(int(where * part.size), part.size - 1)
    opacus = part.composed(steps).compute_epsilon(DELTA, DELTA_ERROR, prv_running.EPS_ERROR)[2]
    part.hint = hint
    assert part.epsilon_upper(steps, DELTA, DELTA_ERROR) == opacus
    sparse = prv_spectral.SparseComposition(spectrum=part.spectrum, size=part.size, low_steps=steps)
    shift, domain = part.placement(steps)
    target = DELTA - DELTA_ERROR
    assert (sparse.search(steps, shift, domain.t_min, domain.dt, target, hint=hint)
            == sparse.search(steps, shift, domain.t_min, domain.dt, target))


@given(bounds=st.tuples(st.floats(-800, 800), st.floats(1e-6, 1600)), size=st.integers(2, 100_000),
       where=st.floats(0, 1))
def test_the_grid_tail_is_numpy_linspace_bit_for_bit(bounds, size, where):
    t_min, width = bounds
    start = min(int(where * size), size - 1)
    assert np.array_equal(prv_running.grid_tail(t_min, t_min + width, size, start),
                          np.linspace(t_min, t_min + width, size)[start:])
