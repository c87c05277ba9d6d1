"""The incremental accountants (issue 16, speed item 3) report the from-scratch epsilon or a little
more, never less, and the budget still stops before the target is exceeded.

Tolerances (docs/privacy.md, "The accountant at round 1,000"):

- PLD: scratch <= incremental <= scratch + 2 RUNNING_MARGIN + ROUNDING_ALLOWANCE x scratch;
- PRV: Opacus <= incremental <= Opacus + 2 MARGIN (4e-4), against eps_error 0.01;
- RDP: equal bit for bit.
"""

import math

import pytest
from fedsec.dp import Accountant
from fedsec.dp.analysis import pld, pld_running, prv, prv_running, rdp
from fedsec.dp.ledger import GaussianEvent
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.privacy import PrivacyBudget
from hypothesis import given, settings
from hypothesis import strategies as st

DELTA = 1e-5
SIGMAS = [0.5, 1.0, 2.0]
RATES = [0.001, 0.01, 0.1]


def _pld_within(value, scratch):
    return scratch <= value <= scratch + 2 * pld.RUNNING_MARGIN + pld.ROUNDING_ALLOWANCE * scratch


def _prv_within(value, scratch):
    return scratch <= value <= scratch + 2 * prv_running.MARGIN


events = st.builds(GaussianEvent, st.sampled_from(SIGMAS), st.sampled_from(RATES), st.integers(1, 30))


@pytest.mark.slow
@given(ledger=st.lists(events, min_size=1, max_size=3))
@settings(max_examples=6, deadline=None)
def test_an_incremental_ledger_gives_the_from_scratch_epsilon_or_a_little_more(ledger):
    """Events recorded one at a time (consecutive equal mechanisms merge into one growing event, as
    in a run); after each, every accountant's epsilon against the from-scratch computation."""
    accountants = {name: Accountant(name) for name in ("pld", "prv", "rdp")}
    for event in ledger:
        for a in accountants.values():
            a.record(event)
        events = list(accountants["pld"].ledger.events)
        assert _pld_within(accountants["pld"].get_epsilon(DELTA),
                           pld.epsilon(events, DELTA, from_scratch=True))
        assert _prv_within(accountants["prv"].get_epsilon(DELTA),
                           prv.epsilon(events, DELTA, from_scratch=True))
        assert accountants["rdp"].get_epsilon(DELTA) == rdp.epsilon(events, DELTA, from_scratch=True)


@pytest.mark.parametrize("sigma,q,counts", [
    (0.5, 0.01, (1, 2, 3, 9, 10, 11, 30, 31, 5)),
    (1.0, 0.01, (1, 2, 3, 9, 10, 11, 40, 41, 300, 7, 301)),
    (2.0, 0.001, (1, 2, 3, 9, 10, 11, 40, 41, 300, 7, 301))])
def test_a_growing_prv_run_crosses_buckets_and_stays_at_opacus_or_a_little_above(sigma, q, counts):
    """Step counts that cross several buckets, with a jump (a resumed run) and a smaller count
    after a larger one."""
    prv_running._ENGINES.clear()
    for steps in counts:
        value = prv.epsilon([GaussianEvent(sigma, q, steps)], DELTA)
        assert _prv_within(value, prv.epsilon([GaussianEvent(sigma, q, steps)], DELTA, from_scratch=True))


@given(steps=st.integers(1, 100_000))
def test_a_bucket_holds_its_step_count_and_is_at_most_one_ratio_above(steps):
    top = prv_running.bucket(steps)
    assert steps <= top <= math.ceil(steps * prv_running.BUCKET_RATIO) + 1
    assert prv_running.bucket(top) == top


@given(sigma=st.sampled_from(SIGMAS), q=st.sampled_from(RATES), steps=st.integers(1, 3000))
@settings(max_examples=10, deadline=None)
def test_a_nested_coarser_discretisation_bounds_each_direction(sigma, q, steps):
    """What the direction skip rests on: at a discretisation ten times coarser (its grid contains
    the finer one, the loss rounded up further) each neighbour direction's pessimistic epsilon is
    at least the finer one's."""
    fine, coarse = pld.discretisations()[3], pld.discretisations()[1]
    assert math.isclose(coarse, 10 * fine)
    engines = [pld_running.RunningPLD(noise_multiplier=sigma, sample_rate=q, discretisation=d)
               for d in (fine, coarse)]
    (fine_remove, fine_add), (coarse_remove, coarse_add) = (
        e.directions(steps, DELTA) for e in engines)
    assert fine_remove <= coarse_remove + 1e-9
    assert fine_add <= coarse_add + 1e-9


@given(sigma=st.sampled_from(SIGMAS), q=st.sampled_from(RATES), steps=st.integers(1, 3000),
       bounds=st.tuples(st.floats(0, 50), st.floats(0, 50)))
@settings(max_examples=20, deadline=None)
def test_the_direction_skip_never_changes_the_larger_direction_when_bounds_hold(sigma, q, steps, bounds):
    engine = pld_running.RunningPLD(noise_multiplier=sigma, sample_rate=q, discretisation=1e-3)
    exact = engine.directions(steps, DELTA)
    valid = (max(bounds[0], exact[0]), max(bounds[1], exact[1]))  # upper bounds, as the skip needs
    assert max(engine.directions(steps, DELTA, valid)) == max(exact)


def _run(budget, rounds):
    records = []
    for r in range(1, rounds + 1):
        if budget.before_round(r):
            break
        budget.charge(r)
        record = RoundRecord(round=r, accuracy=0.0, loss=0.0, train_loss=0.0, participants=1,
                             dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.0)
        budget.after_round(record)
        records.append(record)
    return records


@pytest.mark.parametrize("accountant", ["pld", pytest.param("prv", marks=pytest.mark.slow), "rdp"])
def test_the_budget_stops_before_the_target_is_exceeded(accountant):
    """A run of 0.01-sampled sigma 1 steps, 20 a round, target 2: the last finished round's
    from-scratch epsilon is within the target, the next round's from-scratch epsilon is not."""
    pld_running._ENGINES.clear()
    prv_running._ENGINES.clear()
    event = GaussianEvent(1.0, 0.01, 20)
    budget = PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=2.0, accountant=accountant,
                           unit="example", noise_multiplier=1.0)
    records = _run(budget, 200)
    assert budget.stopped is not None and 0 < len(records) < 200
    scratch = {"pld": lambda e: pld.epsilon(e, DELTA, from_scratch=True),
               "prv": lambda e: prv.epsilon(e, DELTA, from_scratch=True),
               "rdp": lambda e: rdp.epsilon(e, DELTA, from_scratch=True)}[accountant]
    done = len(records)
    assert records[-1].metrics["epsilon"] <= 2.0
    assert scratch([GaussianEvent(1.0, 0.01, 20 * done)]) <= 2.0
    # the next round would exceed the target even by the from-scratch value, up to the tolerance
    tolerance = {"pld": 2 * pld.RUNNING_MARGIN + pld.ROUNDING_ALLOWANCE * 2.0, "prv": 2 * prv_running.MARGIN,
                 "rdp": 0.0}[accountant]
    assert scratch([GaussianEvent(1.0, 0.01, 20 * (done + 1))]) + tolerance > 2.0


@pytest.mark.parametrize("accountant", ["pld", pytest.param("prv", marks=pytest.mark.slow)])
def test_a_resumed_budget_reports_the_same_epsilon(accountant):
    """Checkpoint after 12 rounds, clear every cached engine (a fresh process), load, run on: the
    epsilons equal the uninterrupted run's within the tolerance, and stay above from scratch."""
    event = GaussianEvent(1.3, 0.05, 9)

    def budget():
        return PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=0.0,
                             accountant=accountant, unit="example", noise_multiplier=1.3)

    straight = budget()
    whole = _run(straight, 20)
    first = budget()
    _run(first, 12)
    state = first.state_dict()
    pld_running._ENGINES.clear()
    prv_running._ENGINES.clear()
    resumed = budget()
    resumed.load_state_dict(state)
    tolerance = {"pld": 2 * pld.RUNNING_MARGIN, "prv": 2 * prv_running.MARGIN}[accountant]
    for r in range(13, 21):
        assert resumed.before_round(r) is None
        resumed.charge(r)
        record = RoundRecord(round=r, accuracy=0.0, loss=0.0, train_loss=0.0, participants=1,
                             dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.0)
        resumed.after_round(record)
        assert record.metrics["epsilon"] == pytest.approx(whole[r - 1].metrics["epsilon"],
                                                          abs=tolerance, rel=0)
        assert record.metrics["epsilon_rdp"] == whole[r - 1].metrics["epsilon_rdp"]
    ledger = [GaussianEvent(1.3, 0.05, 9 * 20)]
    scratch = (pld.epsilon(ledger, DELTA, from_scratch=True) if accountant == "pld"
               else prv.epsilon(ledger, DELTA, from_scratch=True))
    assert record.metrics["epsilon"] >= scratch


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.01, 700), (2.0, 0.001, 5), (4.0, 1.0, 10), (0.8, 0.1, 64)])
def test_the_prv_top_scan_is_opacus_compute_epsilon_bit_for_bit(sigma, q, steps):
    """The dense scan over the top of the PMF against Opacus' compute_epsilon over the whole rolled
    PMF (the sparse composition is tested in test_prv_spectral.py)."""
    part = prv_running._Bucket(prv_running.PoissonSubsampledGaussianPRV(q, sigma),
                               prv_running.bucket(steps), DELTA / 1000, sparse=False)
    mine = part.epsilon_upper(steps, DELTA, DELTA / 1000)
    assert mine == part.composed(steps).compute_epsilon(DELTA, DELTA / 1000, prv_running.EPS_ERROR)[2]
