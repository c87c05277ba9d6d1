"""Shamir reconstruction with out-of-range values injected: only ReconstructionError, never a
wrong secret, never another exception."""

import numpy as np
import pytest
from fedsec.secagg import shamir
from fedsec.secagg.errors import ReconstructionError
from hypothesis import given, settings
from hypothesis import strategies as st

PRIME = shamir.PRIME


def shares_of_value(value: int, *, threshold: int, xs: list[int], rng) -> list[int]:
    """Shares of an arbitrary field element (what a lying dealer can hand out)."""
    coefficients = [value] + [int(rng.integers(0, 2**62)) for _ in range(threshold - 1)]
    return [sum(c * pow(x, i, PRIME) for i, c in enumerate(coefficients)) % PRIME for x in xs]


@settings(max_examples=30)
@given(t=st.integers(1, 8), extra=st.integers(0, 4), secret=st.binary(min_size=32, max_size=32),
       data=st.data())
def test_round_trip_and_any_share_out_of_the_field_is_refused(t, extra, secret, data):
    xs = list(range(1, t + extra + 1))
    shares = shamir.split([secret], threshold=t, xs=xs)
    pick = sorted(data.draw(st.lists(st.sampled_from(range(len(xs))), min_size=t, max_size=t,
                                     unique=True)))
    chosen = tuple(xs[i] for i in pick)
    raw = [shamir.share_to_bytes(int(shares[0, i])) for i in pick]
    assert shamir.combine_one(chosen, raw) == secret
    assert shamir.combine(list(chosen), shares[:, pick]) == [secret]
    # Inject a value >= PRIME (as 33 bytes: anything up to 2^264 - 1) in one position.
    where = data.draw(st.integers(0, t - 1))
    bad = data.draw(st.integers(PRIME, 2**264 - 1))
    with pytest.raises(ReconstructionError):
        shamir.combine_one(chosen, raw[:where] + [bad.to_bytes(33, "big")] + raw[where + 1:])
    injected = shares[:, pick].copy()
    injected[0, where] = bad
    with pytest.raises(ReconstructionError):
        shamir.combine(list(chosen), injected)
    injected[0, where] = -1
    with pytest.raises(ReconstructionError):
        shamir.combine(list(chosen), injected)


@settings(max_examples=30)
@given(t=st.integers(1, 8), excess=st.integers(0, PRIME - 2**256 - 1), seed=st.integers(0, 2**32))
def test_shares_of_a_field_element_above_2_256_never_rebuild_a_secret(t, excess, seed):
    """A lying dealer shares a valid field element that is not a 32-byte secret (2^256..p-1)."""
    xs = list(range(1, t + 1))
    shares = shares_of_value(2**256 + excess, threshold=t, xs=xs, rng=np.random.default_rng(seed))
    assert all(0 <= s < PRIME for s in shares)  # every single share looks fine
    with pytest.raises(ReconstructionError):
        shamir.combine_one(tuple(xs), [shamir.share_to_bytes(s) for s in shares])
    with pytest.raises(ReconstructionError):
        shamir.combine(xs, np.array([shares], dtype=object))


@pytest.mark.parametrize("data", [b"", bytes(32), bytes(34), PRIME.to_bytes(33, "big"),
                                  (2**264 - 1).to_bytes(33, "big")])
def test_share_bytes_that_are_not_a_field_element(data):
    with pytest.raises(ReconstructionError):
        shamir.share_from_bytes(data)


def test_combine_refuses_non_integer_shares():
    with pytest.raises(ReconstructionError):
        shamir.combine([1, 2], np.array([[1.5, 2]], dtype=object))
    with pytest.raises(ReconstructionError):
        shamir.combine([1, 2], [[1, 2]])
