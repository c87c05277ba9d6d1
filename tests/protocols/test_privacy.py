"""Client-level DP around the aggregation protocols, and the budget observer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.dp.ledger import GaussianEvent, SkellamEvent
from fedsec.fl_core.aggregation import ClientUpdate, PlainAggregation
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.paillier import PaillierAggregation
from fedsec.protocols.privacy import ClientLevelDP, PrivacyBudget
from fedsec.protocols.privacy.client_level import SkellamShares, sensitivity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_the_sum_of_t_skellam_shares_has_the_target_variance():
    target, t = 2.5e5, 5
    shares = [SkellamShares(target / t, SecureRandom()) for _ in range(t)]
    draws = [s.draw(100_000) for s in shares]
    assert all(int(d.min()) >= 0 and int(d.max()) <= s.slack for d, s in zip(draws, shares, strict=True))
    total = sum(d - s.offset for d, s in zip(draws, shares, strict=True))
    # OS randomness: the mean's standard error is sqrt(target / 100,000) = 1.58, so 8 is 5 of them
    # (a false failure once in 1.7 million runs; 5 was 3.2, once in 630); the variance's is 0.0045
    assert abs(total.mean()) < 8 and abs(total.var() / target - 1) < 0.02


def _updates(n, length, seed=0):
    rng = np.random.default_rng(seed)
    return [ClientUpdate(c, rng.normal(0, 0.5, length).astype(np.float32), 3.0) for c in range(n)]


def _clipped_sum(updates, participants, bound):
    out = np.zeros(updates[0].vector.size)
    for u in updates:
        if u.client_id in participants:
            v = u.vector.astype(np.float64)
            out += v * min(1.0, bound / np.linalg.norm(v))
    return out


@pytest.mark.parametrize("layer", ["masking", "paillier"])
def test_client_level_noise_survives_dropouts(layer):
    rng = np.random.default_rng(0)
    if layer == "masking":
        inner = MaskedAggregation(max_weight=1, rng=rng, clip=1.0, bits=16, dropout=0.3)
    else:
        inner = PaillierAggregation(max_weight=1, rng=rng, clip=1.0, bits=16, threshold=4,
                                    dropout=0.3, key_bits=1024, allow_insecure_key=True)
    z, length, n = 0.8, 2000, 8
    dp = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=z, random=SecureRandom())
    updates = _updates(n, length)
    _, l2 = sensitivity(16, length)
    target_std = z * l2 * 2.0 / (2 ** 16 - 1)  # the target noise, back in update units
    ratios = []
    for round_index in range(12):
        try:
            result = dp.aggregate(round_index, updates)
        except Exception:  # too few survivors: nothing released, nothing to check
            continue
        assert result.total_weight == len(result.participants)  # weight 1 each
        noise = result.weighted_sum - _clipped_sum(updates, result.participants, 1.0)
        ratios.append(noise.std() / target_std)
        assert len(result.participants) >= inner.min_contributions(n)
    assert ratios and min(ratios) > 0.95  # never less than the target noise
    assert dp.round_events(length) == [SkellamEvent(*sensitivity(16, length), (z * l2) ** 2, 1)]


def test_central_noise_and_clipping():
    dp = ClientLevelDP(PlainAggregation(), clip_norm=0.5, noise_multiplier=2.0,
                       random=SecureRandom())
    updates = _updates(5, 20_000)
    result = dp.aggregate(1, updates)
    noise = result.weighted_sum - _clipped_sum(updates, result.participants, 0.5)
    assert abs(noise.std() / 1.0 - 1) < 0.03 and result.total_weight == 5
    assert dp.round_events(10) == [GaussianEvent(2.0, 1.0, 1)]
    with pytest.raises(ValueError):
        ClientLevelDP(MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), clip=0.1),
                      clip_norm=0.5, noise_multiplier=1.0, random=SecureRandom())


def _record(round_index, status="ok"):
    return RoundRecord(round_index, 0.5, 0.5, 0.5, 4, 0, 0, 0.1, 0.1, status=status)


def test_budget_stops_before_the_round_that_would_overshoot():
    budget = PrivacyBudget(profiles=[[GaussianEvent(3.0, 0.1, 10)], [GaussianEvent(3.0, 0.2, 5)]],
                           delta=1e-5, target_epsilon=2.0, accountant="pld", unit="example",
                           noise_multiplier=3.0)
    reported, round_index = [], 1
    while (reason := budget.before_round(round_index)) is None:
        record = _record(round_index, "ok" if round_index != 3 else "aborted: test")
        budget.after_round(record)
        reported.append(record.metrics["epsilon"])
        assert record.metrics["epsilon_rdp"] >= record.metrics["epsilon"]
        round_index += 1
    assert reason == "privacy_budget" and "would bring epsilon" in budget.stopped
    assert 3 < len(reported) < 100 and max(reported) <= 2.0
    assert reported[2] == reported[1]  # an aborted round released nothing and cost nothing
    assert budget.epsilon_after_next_round() > 2.0
    assert math.isclose(record.metrics["budget_remaining"], 2.0 - reported[-1])


def test_client_level_noise_counts_accepted_updates_not_submitted_ones():
    """Rejected clients plus dropouts: 12 submitted, 4 of them malformed (the protocol rejects
    them), 30% dropout among the rest. The noise share is set by the threshold for the 8
    accepted updates (t = 4), not for the 12 submitted (t = 6, which would leave a sum of 4
    survivors with 4/6 of the target variance)."""
    rng = np.random.default_rng(3)
    inner = MaskedAggregation(max_weight=1, rng=rng, clip=1.0, bits=16, dropout=0.3)
    assert inner.min_contributions(12) > inner.min_contributions(8)  # the case that mattered
    z, length = 0.8, 2000
    dp = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=z, random=SecureRandom())
    honest = _updates(8, length, seed=1)
    bad = [ClientUpdate(100 + c, np.full(length, np.nan, np.float32), 1.0) for c in range(2)]
    bad += [ClientUpdate(200 + c, np.full(length, np.inf, np.float32), 1.0) for c in range(2)]
    updates = honest + bad
    _, l2 = sensitivity(16, length)
    target_std = z * l2 * 2.0 / (2 ** 16 - 1)
    ratios, released = [], 0
    for round_index in range(10):
        try:
            result = dp.aggregate(round_index, updates)
        except ProtocolAbort:
            continue
        released += 1
        assert set(range(100, 102)) | set(range(200, 202)) <= set(result.dropped)
        assert result.metrics["rejected"] >= 4
        assert len(result.participants) >= inner.min_contributions(8)
        noise = result.weighted_sum - _clipped_sum(updates, result.participants, 1.0)
        ratio = noise.std() / target_std
        # each survivor's share is 1/(t - c) of the target variance, t the threshold for 8 accepted
        # and c the colluders tolerated among them (0 here: floor(0.1 x 8))
        honest_floor = inner.min_contributions(8) - inner.tolerated_colluders(8)
        assert ratio == pytest.approx(math.sqrt(len(result.participants) / honest_floor), rel=0.06)
        ratios.append(ratio)
    assert released >= 3 and min(ratios) > 0.95


class _OverstatedThreshold(MaskedAggregation):
    """A protocol whose stated threshold is above the sums it releases (a misconfiguration)."""

    def min_contributions(self, n):
        return n + 1


def test_a_sum_with_fewer_contributions_than_the_noise_assumes_is_refused():
    inner = _OverstatedThreshold(max_weight=1, rng=np.random.default_rng(0), clip=1.0, bits=16)
    dp = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=0.8, random=SecureRandom())
    with pytest.raises(ProtocolAbort, match="less than the accounted noise"):
        dp.aggregate(1, _updates(5, 50))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid=st.integers(3, 9), bad=st.integers(0, 5), dropout=st.sampled_from([0.0, 0.2, 0.4]),
       seed=st.integers(0, 2**32 - 1))
def test_searched_rejections_and_dropouts_never_release_less_than_the_target_noise(
        valid, bad, dropout, seed):
    """The adversary searches over how many clients send malformed updates and how many drop
    out; the honest protocol either refuses the round or releases at least the target noise."""
    rng = np.random.default_rng(seed)
    inner = MaskedAggregation(max_weight=1, rng=rng, clip=1.0, bits=16, dropout=dropout)
    z, length = 0.8, 2000
    dp = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=z, random=SecureRandom())
    updates = _updates(valid, length, seed=seed % 1000)
    updates += [ClientUpdate(50 + c, np.full(length, np.nan, np.float32), 1.0) for c in range(bad)]
    rng.shuffle(updates)
    _, l2 = sensitivity(16, length)
    try:
        result = dp.aggregate(1, updates)
    except ProtocolAbort:
        return
    assert len(result.participants) >= inner.min_contributions(valid)
    noise = result.weighted_sum - _clipped_sum(updates, result.participants, 1.0)
    assert noise.std() / (z * l2 * 2.0 / (2 ** 16 - 1)) > 0.93
