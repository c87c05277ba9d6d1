"""The threaded mask accumulator equals the plain signed sum of the masks mod 2^b (the caller
reduces), whatever the number of threads."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.prg import MaskExpander, MaskSum, accumulate_masks
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


@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.sampled_from([-1, 1])), max_size=30),
       st.integers(1, 200), st.sampled_from([8, 32, 33, 64]), st.integers(1, 4))
def test_streamed_masks_equal_the_signed_sum(items, length, bits, threads):
    """Keys handed in one at a time while the workers already expand the first ones."""
    expander = MaskExpander(length=length, modulus_bits=bits)
    expected = np.zeros(length, dtype=object)
    for key, sign in items:
        expected = expected + sign * expander.expand(key).astype(object)
    with MaskSum(length=length, modulus_bits=bits, threads=threads) as masks:
        for key, sign in items:
            masks.add(key, sign)
        got = masks.finish()
    assert got.dtype == expander.dtype
    assert (got.astype(object) % (1 << bits) == expected % (1 << bits)).all()


def test_leaving_early_stops_every_worker_and_restores_the_switch_interval():
    before_threads, before_interval = threading.active_count(), sys.getswitchinterval()
    with pytest.raises(KeyError), MaskSum(length=1000, modulus_bits=32, threads=3) as masks:
        for i in range(50):
            masks.add(bytes([i]) * 32, 1)
        assert sys.getswitchinterval() <= 1e-4  # lowered while the workers run
        raise KeyError("the caller aborts mid-stream")
    assert threading.active_count() == before_threads
    assert sys.getswitchinterval() == before_interval


def test_bad_use_is_refused():
    with pytest.raises(InvalidArgumentError):
        MaskSum(length=0, modulus_bits=32)
    with pytest.raises(InvalidArgumentError):
        MaskSum(length=4, modulus_bits=32, threads=0)
    with MaskSum(length=4, modulus_bits=32, threads=2) as masks:
        with pytest.raises(InvalidArgumentError):
            masks.add(bytes(32), 0)
        masks.finish()
        with pytest.raises(RuntimeError):
            masks.add(bytes(32), 1)
    with pytest.raises(RuntimeError):
        MaskSum(length=4, modulus_bits=32).add(bytes(32), 1)


def test_concurrent_sums_restore_the_switch_interval_once_the_last_ends():
    original = sys.getswitchinterval()
    first = MaskSum(length=64, modulus_bits=32, threads=2).__enter__()
    second = MaskSum(length=64, modulus_bits=32, threads=2).__enter__()
    first.add(bytes(32), 1)
    first.finish()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() <= 1e-4  # the second still runs
    second.finish()
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == original
