import numpy as np
import pytest
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.errors import EncodingError, InvalidArgumentError, WrapRiskError
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

finite = st.floats(-10, 10, allow_nan=False, width=32)


@given(bits=st.integers(1, 32), clip=st.floats(0.01, 100), data=st.data())
def test_sum_decodes_to_the_weighted_sum_within_quantisation(bits, clip, data):
    k = data.draw(st.integers(1, 8))
    max_weight = data.draw(st.integers(1, 1000))
    enc = FixedPointEncoder(clip=clip, bits=bits, max_clients=k, max_weight=max_weight, max_length=16)
    vectors = [data.draw(hnp.arrays(np.float32, 16, elements=finite)) for _ in range(k)]
    weights = [data.draw(st.integers(1, max_weight)) for _ in range(k)]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    encoded = [enc.encode(v, w, rng=rng) for v, w in zip(vectors, weights)]
    total = enc.reduce(sum(e.words.astype(np.uint64) for e in encoded).astype(enc.dtype))
    weighted, total_weight, clipped = enc.decode(total)
    expected = sum(w * np.clip(v.astype(np.float64), -clip, clip) for v, w in zip(vectors, weights))
    assert total_weight == sum(weights)
    assert clipped == sum(int((np.abs(v.astype(np.float64)) > clip).sum()) for v in vectors)
    step = 2 * clip / enc.levels
    bound = step * sum(weights) * (1 + 1e-9) + 1e-9 * clip * sum(weights)
    assert np.all(np.abs(weighted - expected) <= bound)


@given(bits=st.integers(1, 32), k=st.integers(1, 50), max_weight=st.integers(1, 10**6))
def test_headroom_edge_never_wraps(bits, k, max_weight):
    """k clients at the largest weight, every value at +clip: the sum still fits the modulus."""
    enc = FixedPointEncoder(clip=1.0, bits=bits, max_clients=k, max_weight=max_weight, max_length=4)
    top = enc.encode(np.full(4, 1.0), max_weight, rng=np.random.default_rng(0)).words
    total = sum(int(w) for w in top[:1]) * k
    assert total < 2 ** enc.modulus_bits
    words = enc.reduce((top.astype(object) * k).astype(np.uint64).astype(enc.dtype))
    weighted, total_weight, _ = enc.decode(words)
    assert np.allclose(weighted, k * max_weight * 1.0)
    assert total_weight == k * max_weight


@given(values=hnp.arrays(np.float64, st.integers(1, 50), elements=st.floats(-5, 5)))
def test_negative_and_positive_values_round_trip(values):
    enc = FixedPointEncoder(clip=5.0, bits=24, max_clients=1, max_weight=1, max_length=50)
    weighted, _, clipped = enc.decode(enc.encode(values, 1, rng=np.random.default_rng(1)).words)
    assert clipped == 0
    assert np.all(np.abs(weighted - values) <= 10.0 / enc.levels + 1e-12)


def test_stochastic_rounding_is_unbiased():
    enc = FixedPointEncoder(clip=1.0, bits=2, max_clients=1, max_weight=1, max_length=200_000)
    x = np.full(200_000, 0.1)
    weighted, _, _ = enc.decode(enc.encode(x, 1, rng=np.random.default_rng(0)).words)
    assert abs(weighted.mean() - 0.1) < 0.005


@given(bits=st.integers(1, 48), data=st.data())
def test_wire_bytes_round_trip(bits, data):
    enc = FixedPointEncoder(clip=1.0, bits=bits, max_clients=3, max_weight=5, max_length=20)
    words = np.array(data.draw(st.lists(st.integers(0, 2**enc.modulus_bits - 1), min_size=22, max_size=22)),
                     dtype=enc.dtype)
    raw = enc.to_bytes(words)
    assert len(raw) == 22 * enc.word_bytes
    assert np.array_equal(enc.from_bytes(raw, 22), words)


def test_bad_inputs_are_typed_errors():
    enc = FixedPointEncoder(clip=1.0, bits=8, max_clients=2, max_weight=10, max_length=3)
    rng = np.random.default_rng(0)
    for bad in (np.array([1.0, np.nan, 0.0]), np.zeros((3, 1)), np.zeros(4)):
        with pytest.raises(EncodingError):
            enc.encode(bad, 1, rng=rng)
    for weight in (0, 11, 2.5, True):
        with pytest.raises(EncodingError):
            enc.encode(np.zeros(3), weight, rng=rng)
    with pytest.raises(EncodingError):
        enc.from_bytes(b"\x00" * 5, 3)
    with pytest.raises(WrapRiskError):
        FixedPointEncoder(clip=1.0, bits=48, max_clients=10**4, max_weight=10**3)
    with pytest.raises(InvalidArgumentError):
        FixedPointEncoder(clip=0.0, bits=8, max_clients=1, max_weight=1)
