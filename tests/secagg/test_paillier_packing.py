"""Property tests of slot packing: round trips, K-way sums at the headroom edge, negative values."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.errors import EncodingError, WrapRiskError
from fedsec.secagg.paillier import SlotLayout, slot_bits_for
from hypothesis import given, settings
from hypothesis import strategies as st

PLAINTEXT_BITS = 2047


@st.composite
def words_and_layout(draw):
    slot_bits = draw(st.integers(1, 64))
    tag_bits = draw(st.sampled_from([0, 1, 130, 200]))
    length = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**slot_bits, size=length, dtype=np.uint64, endpoint=False)
    layout = SlotLayout(slot_bits=slot_bits, plaintext_bits=PLAINTEXT_BITS, tag_bits=tag_bits)
    tags = [int(rng.integers(0, 2**min(tag_bits, 63))) for _ in range(layout.ciphertexts_for(length))]
    return layout, words, tags


@settings(max_examples=60, deadline=None)
@given(words_and_layout())
def test_pack_unpack_round_trip(case):
    layout, words, tags = case
    plaintexts = layout.pack(words, tags if layout.tag_bits else None)
    assert len(plaintexts) == layout.ciphertexts_for(words.size)
    assert all(0 <= p < 1 << PLAINTEXT_BITS for p in plaintexts)
    back, got_tags = layout.unpack(plaintexts, words.size)
    assert np.array_equal(back, words)
    assert got_tags == (tags if layout.tag_bits else [0] * len(plaintexts))


@settings(max_examples=40, deadline=None)
@given(word_bits=st.integers(1, 40), contributions=st.integers(1, 300), length=st.integers(1, 300),
       edge=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_k_way_sums_never_carry_between_slots(word_bits, contributions, length, edge, seed):
    word_bound = (1 << word_bits) - 1
    slot_bits = slot_bits_for(word_bound, contributions)
    if slot_bits > 64:
        with pytest.raises(WrapRiskError):
            SlotLayout(slot_bits=slot_bits, plaintext_bits=PLAINTEXT_BITS, tag_bits=136)
        return
    layout = SlotLayout(slot_bits=slot_bits, plaintext_bits=PLAINTEXT_BITS, tag_bits=136)
    rng = np.random.default_rng(seed)
    vectors = [np.full(length, word_bound, dtype=np.uint64) if edge else
               rng.integers(0, word_bound, size=length, dtype=np.uint64, endpoint=True)
               for _ in range(contributions)]
    tag_bound = (1 << 136) // contributions - 1
    tags = [[int(rng.integers(0, 2**62)) * (tag_bound >> 62) for _ in
             range(layout.ciphertexts_for(length))] for _ in range(contributions)]
    sums = [0] * layout.ciphertexts_for(length)
    for v, t in zip(vectors, tags, strict=True):
        for k, p in enumerate(layout.pack(v, t)):
            sums[k] += p  # what multiplying ciphertexts does to plaintexts
    total, got_tags = layout.unpack(sums, length)
    expected = np.zeros(length, dtype=object)
    for v in vectors:
        expected = expected + v.astype(object)
    assert total.astype(object).tolist() == expected.tolist()
    assert got_tags == [sum(t[k] for t in tags) for k in range(len(sums))]


@settings(max_examples=30, deadline=None)
@given(clients=st.integers(1, 20), bits=st.integers(2, 20), seed=st.integers(0, 2**32 - 1))
def test_negative_values_survive_offset_encoding_and_packing(clients, bits, seed):
    rng = np.random.default_rng(seed)
    clip, max_weight, length = 0.5, 30, 64
    encoder = FixedPointEncoder(clip=clip, bits=bits, max_clients=clients, max_weight=max_weight,
                                max_length=length)
    word_bound = max(max_weight * encoder.levels, length)
    layout = SlotLayout(slot_bits=slot_bits_for(word_bound, clients), plaintext_bits=PLAINTEXT_BITS)
    assert layout.slot_bits == encoder.modulus_bits
    vectors = [rng.uniform(-0.7, 0.0, length) for _ in range(clients)]  # negative, some clipped
    weights = [int(rng.integers(1, max_weight + 1)) for _ in range(clients)]
    sums = None
    for v, w in zip(vectors, weights, strict=True):
        packed = layout.pack(encoder.encode(v, w, rng=rng).words)
        sums = packed if sums is None else [a + b for a, b in zip(sums, packed, strict=True)]
    total, _ = layout.unpack(sums, length + 2)
    weighted, total_weight, clipped = encoder.decode(total)
    expected = sum(w * np.clip(v, -clip, clip) for v, w in zip(vectors, weights, strict=True))
    assert total_weight == sum(weights)
    assert clipped == sum(int(np.count_nonzero(np.abs(v) > clip)) for v in vectors)
    assert np.abs(weighted - expected).max() <= sum(weights) * 2 * clip / encoder.levels + 1e-9


def test_pack_refuses_words_that_do_not_fit_and_layouts_without_room():
    layout = SlotLayout(slot_bits=8, plaintext_bits=PLAINTEXT_BITS)
    with pytest.raises(EncodingError):
        layout.pack(np.array([256], dtype=np.uint64))
    with pytest.raises(EncodingError):
        layout.pack(np.array([-1], dtype=np.int64))
    with pytest.raises(EncodingError):
        layout.pack(np.array([1.0]))
    with pytest.raises(EncodingError):
        layout.unpack([1 << PLAINTEXT_BITS], 1)
    with pytest.raises(WrapRiskError):
        SlotLayout(slot_bits=65, plaintext_bits=PLAINTEXT_BITS)
    with pytest.raises(WrapRiskError):
        SlotLayout(slot_bits=64, plaintext_bits=200, tag_bits=150)
    assert slot_bits_for(2**16 - 1, 10) == 20
