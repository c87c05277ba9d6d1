"""Median, trimmed mean and norm bounding behind the seam, against numpy/scipy and an attacker."""

import numpy as np
import pytest
from fedsec.fl_core import ClientUpdate, PlainAggregation, TooFewClientsError
from fedsec.fl_core.byzantine import ByzantineClients, corrupt
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.robust import (
    NormBoundedAggregation,
    RobustAggregation,
    coordinate_median,
    trimmed_count,
    trimmed_mean,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


def _updates(rows, weights=None):
    weights = weights if weights is not None else [1.0] * len(rows)
    return [ClientUpdate(k, np.asarray(r, dtype=np.float32), float(w))
            for k, (r, w) in enumerate(zip(rows, weights))]


@settings(max_examples=25, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 9), st.integers(1, 6)), elements=finite))
def test_median_is_numpys_median_whatever_the_weights(rows):
    weights = np.linspace(1, 50, rows.shape[0])
    result = RobustAggregation(rule="median").aggregate(1, _updates(rows, weights))
    np.testing.assert_allclose(result.weighted_sum / result.total_weight,
                               np.median(rows.astype(np.float64), axis=0), rtol=1e-12)
    assert result.total_weight == rows.shape[0]


@settings(max_examples=25, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 5)), elements=finite),
       st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.3, 0.49]))
def test_trimmed_mean_is_scipys_trim_mean(rows, trim):
    result = RobustAggregation(rule="trimmed_mean", trim=trim).aggregate(1, _updates(rows))
    n = rows.shape[0]
    if trimmed_count(n, trim) == int(np.floor(trim * n + 1e-9)):
        expected = stats.trim_mean(rows.astype(np.float64), trim, axis=0)
        np.testing.assert_allclose(result.average(), expected.astype(np.float32), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(result.weighted_sum / n, trimmed_mean(rows, trim), rtol=1e-12)


def test_trimmed_mean_by_hand():
    rows = np.array([[1.0, 10.0], [2.0, -50.0], [3.0, 20.0], [100.0, 30.0], [-7.0, 40.0]])
    # cut floor(0.2 * 5) = 1 from each end per coordinate
    np.testing.assert_allclose(trimmed_mean(rows, 0.2), [2.0, 20.0])
    np.testing.assert_allclose(coordinate_median(rows), [2.0, 20.0])
    assert trimmed_count(4, 0.49) == 1 and trimmed_count(2, 0.49) == 0


def test_bad_updates_are_rejected_not_voted_and_bad_parameters_raise():
    rows = [[1.0, 1.0], [2.0, 2.0], [np.nan, 0.0], [3.0]]
    result = RobustAggregation(rule="median").aggregate(1, _updates(rows[:3]) + [
        ClientUpdate(3, np.array([3.0], dtype=np.float32), 1.0)])
    assert result.participants == (0, 1) and set(result.dropped) == {2, 3}
    np.testing.assert_allclose(result.average(), [1.5, 1.5])
    with pytest.raises(TooFewClientsError):
        RobustAggregation(rule="median", min_clients=3).aggregate(1, _updates(rows[:3]))
    for kwargs in ({"rule": "mean"}, {"rule": "trimmed_mean", "trim": 0.5}, {"rule": "median",
                                                                            "min_clients": 0}):
        with pytest.raises(InvalidParameterError):
            RobustAggregation(**kwargs)
    with pytest.raises(InvalidParameterError):
        NormBoundedAggregation(inner=PlainAggregation(), bound=0.0)


def test_statistics_requests_are_summed_not_voted():
    rows = np.array([[1.0], [2.0], [30.0]])
    result = RobustAggregation(rule="median").aggregate(0, _updates(rows, [1, 2, 3]),
                                                         purpose="statistics")
    assert result.weighted_sum[0] == pytest.approx(1 + 4 + 90) and result.total_weight == 6


@settings(max_examples=20, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 8)), elements=finite),
       st.floats(0.01, 100.0))
def test_norm_bound_clips_every_update_to_the_bound_and_leaves_short_ones(rows, bound):
    result = NormBoundedAggregation(inner=PlainAggregation(), bound=bound).aggregate(1, _updates(rows))
    norms = np.linalg.norm(rows.astype(np.float64), axis=1)
    expected = sum(r * min(1.0, bound / n) if n > 0 else r for r, n in zip(rows.astype(np.float64),
                                                                           norms))
    np.testing.assert_allclose(result.weighted_sum, expected, rtol=1e-5, atol=1e-5 * bound)
    assert result.metrics["norm_clipped"] == float(np.sum(norms > bound))
    assert np.linalg.norm(result.weighted_sum) <= bound * rows.shape[0] * (1 + 1e-5)


def test_attacks_do_what_they_say():
    rng = np.random.default_rng(0)
    u = np.array([1.0, -2.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(corrupt(u, "sign_flip", factor=10, rng=rng), -u)
    np.testing.assert_array_equal(corrupt(u, "scale", factor=10, rng=rng), 10 * u)
    noise = np.stack([corrupt(u, "noise", factor=10, rng=rng) for _ in range(2000)])
    assert abs(noise.std() - 10 * np.sqrt(3)) < 0.5 and abs(noise.mean()) < 0.5
    with pytest.raises(InvalidParameterError):
        corrupt(u, "flip", factor=1, rng=rng)
    wrapped = ByzantineClients(inner=PlainAggregation(), malicious=[1], attack="sign_flip", rng=rng)
    result = wrapped.aggregate(1, _updates([u, u, u]))
    np.testing.assert_allclose(result.weighted_sum, u)  # u - u + u


@pytest.mark.parametrize("attack", ["sign_flip", "scale", "noise"])
@pytest.mark.parametrize("n,bad", [(4, 1), (10, 3)])
def test_a_searching_attacker_moves_the_median_and_trimmed_mean_only_within_the_honest_range(
        attack, n, bad):
    """Byzantine clients, chosen at random, sending random lies of every kind and size: the median
    and the trimmed mean (trim >= bad / n) stay inside the honest updates' coordinate range; the
    mean leaves it."""
    rng = np.random.default_rng([n, bad, len(attack)])
    mean_escaped = 0
    for trial in range(30):
        honest = rng.normal(1.0, 0.1, size=(n, 5)).astype(np.float32)
        malicious = rng.choice(n, size=bad, replace=False)
        factor = float(rng.choice([10.0, 100.0, 1e4]))
        kind = attack if trial % 2 else str(rng.choice(["sign_flip", "scale", "noise"]))
        honest_rows = np.delete(honest, malicious, axis=0)
        low, high = honest_rows.min(axis=0), honest_rows.max(axis=0)
        for rule, trim in (("median", 0.1), ("trimmed_mean", 0.3)):
            protocol = ByzantineClients(inner=RobustAggregation(rule=rule, trim=trim),
                                        malicious=malicious, attack=kind, factor=factor, rng=rng)
            centre = protocol.aggregate(1, _updates(honest)).average()
            assert np.all(centre >= low - 1e-5) and np.all(centre <= high + 1e-5), (rule, kind)
        mean = ByzantineClients(inner=PlainAggregation(), malicious=malicious, attack=kind,
                                factor=factor, rng=rng).aggregate(1, _updates(honest)).average()
        mean_escaped += bool(np.any(mean < low) or np.any(mean > high))
    assert mean_escaped >= 15


def test_an_exhaustive_colluding_pair_cannot_push_the_median_or_trimmed_mean_out_of_the_honest_range():
    """n = 5, f = 2 colluders, d = 2: every pair of lies from a grid of extreme and in-range values
    (5^4 joint choices), against the unmodified rules."""
    honest = np.array([[0.0, 1.0], [0.5, 2.0], [1.0, 3.0]])
    low, high = honest.min(axis=0), honest.max(axis=0)
    grid = [-1e6, -1.0, 0.7, 4.0, 1e6]
    rules = (RobustAggregation(rule="median"), RobustAggregation(rule="trimmed_mean", trim=0.4))
    for a0 in grid:
        for a1 in grid:
            for b0 in grid:
                for b1 in grid:
                    rows = np.vstack([honest, [[a0, a1], [b0, b1]]]).astype(np.float32)
                    for rule in rules:
                        centre = rule.aggregate(1, _updates(rows)).average()
                        assert np.all(centre >= low - 1e-6) and np.all(centre <= high + 1e-6)
