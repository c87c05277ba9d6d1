"""The encodable clip range: every clip inside it round-trips with finite sums within quantisation;
every clip outside it is refused up front with an error naming ``clip`` and the range."""

import math
import sys

import numpy as np
import pytest
from fedsec.secagg.encoding import MAX_MODULUS_BITS, FixedPointEncoder, clip_range
from fedsec.secagg.errors import EncodingError, InvalidArgumentError
from hypothesis import given, settings
from hypothesis import strategies as st


def test_range_formula():
    lo, hi = clip_range(16, 29)
    assert lo == 2.0**16 * sys.float_info.min
    assert hi == sys.float_info.max / 2.0**31
    assert clip_range(16)[1] == sys.float_info.max / 2.0 ** (MAX_MODULUS_BITS + 2)


@pytest.mark.parametrize("clip", [1e308, 1e-310, 5e-324, sys.float_info.max])
def test_clips_that_pass_as_numbers_but_cannot_be_encoded_are_refused(clip):
    with pytest.raises(InvalidArgumentError, match=r"clip must be in \["):
        FixedPointEncoder(clip=clip, bits=16, max_clients=10, max_weight=100, max_length=8)


def _extreme_round_trip(clip: float, bits: int, clients: int, max_weight: int) -> None:
    enc = FixedPointEncoder(clip=clip, bits=bits, max_clients=clients, max_weight=max_weight,
                            max_length=4)
    rng = np.random.default_rng(0)
    vectors = [np.array([-clip, clip, 0.5 * clip, -0.25 * clip]) for _ in range(clients)]
    words = [enc.encode(v, max_weight, rng=rng).words for v in vectors]
    total = enc.reduce(sum(w.astype(object) for w in words).astype(np.uint64).astype(enc.dtype))
    weighted, total_weight, clipped = enc.decode(total)
    expected = sum(max_weight * v for v in vectors)
    assert np.isfinite(weighted).all() and clipped == 0 and total_weight == clients * max_weight
    step = 2 * clip / enc.levels
    assert np.all(np.abs(weighted - expected) <= total_weight * step * (1 + 1e-6))


@settings(max_examples=40)
@given(bits=st.integers(1, 32), clients=st.integers(1, 50), max_weight=st.integers(1, 10**4),
       where=st.floats(0, 1))
def test_every_clip_in_the_range_encodes_and_decodes(bits, clients, max_weight, where):
    probe = FixedPointEncoder(clip=1.0, bits=bits, max_clients=clients, max_weight=max_weight,
                              max_length=4)
    lo, hi = clip_range(bits, probe.modulus_bits)
    clip = math.exp(math.log(lo) + where * (math.log(hi) - math.log(lo)))
    clip = min(max(clip, lo), hi)
    _extreme_round_trip(clip, bits, clients, max_weight)


@pytest.mark.parametrize("bits", [1, 16, 32])
def test_the_range_ends_are_inclusive_and_one_step_beyond_is_refused(bits):
    probe = FixedPointEncoder(clip=1.0, bits=bits, max_clients=20, max_weight=1000, max_length=4)
    lo, hi = clip_range(bits, probe.modulus_bits)
    for clip in (lo, hi):
        _extreme_round_trip(clip, bits, 20, 1000)
    for clip in (math.nextafter(lo, 0), math.nextafter(hi, math.inf)):
        with pytest.raises(InvalidArgumentError, match="clip"):
            FixedPointEncoder(clip=clip, bits=bits, max_clients=20, max_weight=1000, max_length=4)


@pytest.mark.parametrize("vector,weight", [
    (np.array(["1", "2"]), 1), (np.array([1.0, 2.0], dtype=object), 1), (np.ones(2, dtype=complex), 1),
    (np.zeros(2), None), (np.zeros(2), "1"), (np.zeros(2), 10**400), (np.zeros(2), np.bool_(True)),
    (np.zeros(2), float("nan")), (np.full(2, 1e300, np.longdouble) ** 2, 1)])
def test_encode_refuses_what_is_not_a_real_vector_or_an_integer_weight(vector, weight):
    enc = FixedPointEncoder(clip=1.0, bits=8, max_clients=2, max_weight=10, max_length=3)
    with pytest.raises(EncodingError):
        enc.encode(vector, weight, rng=np.random.default_rng(0))
