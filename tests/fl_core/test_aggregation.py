import numpy as np
import pytest
from fedsec.fl_core import ClientUpdate, InvalidParameterError, PlainAggregation, TooFewClientsError
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


@given(
    vectors=st.lists(hnp.arrays(np.float32, 7, elements=st.floats(-1e3, 1e3, width=32)), min_size=1,
                     max_size=8),
    weights=st.lists(st.integers(1, 1000), min_size=8, max_size=8),
)
def test_weighted_sum_and_average(vectors, weights):
    updates = [ClientUpdate(k, v, float(w)) for k, (v, w) in enumerate(zip(vectors, weights))]
    result = PlainAggregation().aggregate(1, updates)
    expected = sum(w * v.astype(np.float64) for v, w in zip(vectors, weights))
    assert np.allclose(result.weighted_sum, expected, rtol=1e-12, atol=1e-9)
    assert result.total_weight == sum(weights[: len(vectors)])
    assert result.participants == tuple(range(len(vectors)))
    assert np.allclose(result.average(), expected / result.total_weight, rtol=1e-6, atol=1e-4)


def test_bad_updates_are_rejected_and_counted_not_summed():
    good = np.ones(4, np.float32)
    nan = good.copy()
    nan[2] = np.nan
    updates = [
        ClientUpdate(0, good, 2.0),
        ClientUpdate(1, nan, 1.0),
        ClientUpdate(2, np.ones(5, np.float32), 1.0),
        ClientUpdate(3, good, 0.0),
        ClientUpdate(4, good, float("inf")),
        ClientUpdate(5, 3 * good, 1.0),
    ]
    result = PlainAggregation().aggregate(1, updates)
    assert result.participants == (0, 5)
    assert result.dropped == (1, 2, 3, 4)
    assert result.metrics["rejected"] == 4
    assert np.array_equal(result.weighted_sum, np.full(4, 5.0))
    assert result.total_weight == 3.0


def test_too_few_clients_is_a_typed_abort():
    with pytest.raises(TooFewClientsError) as info:
        PlainAggregation(min_clients=3).aggregate(1, [ClientUpdate(0, np.ones(2, np.float32), 1.0)])
    assert (info.value.received, info.value.required) == (1, 3)
    with pytest.raises(TooFewClientsError):
        PlainAggregation().aggregate(1, [])
    with pytest.raises(InvalidParameterError):
        PlainAggregation(min_clients=0)
