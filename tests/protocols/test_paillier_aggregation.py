"""PaillierAggregation behind the fl_core seam: sums match the plain protocol within quantisation."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate, PlainAggregation
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.paillier import PaillierAggregation, default_threshold


def _updates(n=5, length=300, seed=0):
    rng = np.random.default_rng(seed)
    return [ClientUpdate(c, rng.uniform(-0.9, 0.9, length).astype(np.float32), float(5 + c))
            for c in range(n)]


def _protocol(custody, **kwargs):
    kwargs.setdefault("threshold", 3)
    return PaillierAggregation(max_weight=20, rng=np.random.default_rng(1), key_bits=1024,
                               allow_insecure_key=True, custody=custody, parties=range(6), **kwargs)


@pytest.mark.parametrize("custody", ["key_holder", "threshold"])
def test_sum_matches_plain_within_quantisation(custody):
    updates = _updates()
    protocol = _protocol(custody)
    for round_index in range(2):
        result = protocol.aggregate(round_index, updates)
        plain = PlainAggregation().aggregate(round_index, updates)
        step = 2 * protocol.clip / (2**protocol.bits - 1)
        assert result.total_weight == plain.total_weight
        assert np.abs(result.weighted_sum - plain.weighted_sum).max() <= plain.total_weight * step
        assert result.participants == (0, 1, 2, 3, 4) and result.dropped == ()
        assert result.metrics["contributions"] == 5 and result.metrics["clipped"] == 0
        assert result.upload_bytes > 5 * 128 * protocol.public_key.key_bits // 1024


@pytest.mark.parametrize("custody", ["key_holder", "threshold"])
def test_dropouts_leave_the_sum_of_the_rest_or_abort(custody):
    updates = _updates(6)
    protocol = _protocol(custody, dropout=0.3)
    outcomes = []
    for round_index in range(8):
        try:
            result = protocol.aggregate(round_index, updates)
        except ProtocolAbort:
            outcomes.append("abort")
            continue
        outcomes.append(len(result.participants))
        survivors = [u for u in updates if u.client_id in result.participants]
        expected = sum(u.weight * np.clip(u.vector, -1, 1).astype(np.float64) for u in survivors)
        assert result.total_weight == sum(u.weight for u in survivors)
        assert np.abs(result.weighted_sum - expected).max() < 1e-2
        assert set(result.participants) | set(result.dropped) == set(range(6))
    assert any(o != 6 for o in outcomes) and any(o != "abort" for o in outcomes)


def test_bad_updates_are_rejected_and_too_few_abort():
    updates = _updates(4)
    bad = ClientUpdate(9, np.full(300, np.nan, dtype=np.float32), 5.0)
    protocol = _protocol("key_holder")
    result = protocol.aggregate(0, [*updates, bad])
    assert result.metrics["rejected"] == 1 and 9 in result.dropped
    with pytest.raises(ProtocolAbort, match="only sums of >= 3"):
        protocol.aggregate(1, updates[:2])
    with pytest.raises(InvalidParameterError):
        _protocol("threshold", threshold=7)
    with pytest.raises(InvalidParameterError):
        _protocol("vault")
    assert [default_threshold(m) for m in (2, 3, 4, 10)] == [2, 2, 3, 6]


def test_statistics_purpose_is_exact_to_many_digits():
    rng = np.random.default_rng(3)
    updates = [ClientUpdate(c, rng.normal(50, 30, 20).astype(np.float32), 10.0) for c in range(4)]
    result = _protocol("key_holder").aggregate(0, updates, purpose="statistics")
    plain = PlainAggregation().aggregate(0, updates)
    assert np.allclose(result.weighted_sum, plain.weighted_sum, rtol=0, atol=1e-4)
