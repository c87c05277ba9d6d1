"""The threaded mask accumulator equals the plain signed sum of the masks mod 2^b (the caller
reduces), whatever the number of threads."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.secagg.prg import MaskExpander, accumulate_masks
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.sampled_from([-1, 1])), max_size=40),
       st.integers(1, 300), st.sampled_from([8, 31, 32, 33, 64]), st.integers(1, 4))
def test_accumulated_masks_equal_the_signed_sum(items, length, bits, threads):
    expander = MaskExpander(length=length, modulus_bits=bits)
    expected = np.zeros(length, dtype=object)
    for key, sign in items:
        expected = expected + sign * expander.expand(key).astype(object)
    got = accumulate_masks(items, length=length, modulus_bits=bits, threads=threads)
    assert got.dtype == expander.dtype
    assert (got.astype(object) % (1 << bits) == expected % (1 << bits)).all()


def test_a_failing_key_in_a_worker_surfaces_in_the_caller():
    items = [(bytes(32), 1)] * 20 + [(b"short", 1)]
    with pytest.raises(ValueError):
        accumulate_masks(items, length=16, modulus_bits=32, threads=3)
