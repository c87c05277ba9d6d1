"""combine_one (exact binomial coefficients, one inversion) equals the Lagrange sum over
lagrange_at_zero, for every set of points, and fails the same way on bad shares."""

from __future__ import annotations

import pytest
from fedsec.secagg import shamir
from fedsec.secagg.errors import ReconstructionError
from hypothesis import given
from hypothesis import strategies as st


def _reference(xs, values):
    weights = shamir.lagrange_at_zero(tuple(xs))
    return sum(w * y for w, y in zip(weights, values, strict=True)) % shamir.PRIME


@st.composite
def point_sets(draw):
    top = draw(st.sampled_from([1, 2, 5, 20, 67, 96, 140, 512, 513, 700]))
    t = draw(st.integers(1, min(top, 40)))
    xs = draw(st.lists(st.integers(1, top), min_size=t, max_size=t, unique=True))
    if top not in xs:
        xs[draw(st.integers(0, t - 1))] = top  # the largest point decides the path taken
    return xs


@given(point_sets(), st.data())
def test_combine_one_equals_the_lagrange_sum(xs, data):
    values = data.draw(st.lists(st.integers(0, shamir.PRIME - 1), min_size=len(xs), max_size=len(xs)))
    expected = _reference(xs, values)
    shares = [shamir.share_to_bytes(v) for v in values]
    if expected >= 2**256:
        with pytest.raises(ReconstructionError):
            shamir.combine_one(tuple(xs), shares)
    else:
        assert shamir.combine_one(tuple(xs), shares) == shamir.int_to_secret(expected)


@given(st.binary(min_size=32, max_size=32), st.integers(2, 30), st.data())
def test_combine_one_rebuilds_a_split_secret_from_any_t_points(secret, t, data):
    k = data.draw(st.integers(t, 100))
    shares = shamir.split([secret], threshold=t, xs=range(1, k + 1))
    xs = data.draw(st.lists(st.integers(1, k), min_size=t, max_size=t, unique=True))
    assert shamir.combine_one(tuple(xs), [shamir.share_to_bytes(int(shares[0, x - 1])) for x in xs]) == secret


@pytest.mark.parametrize("bad", [shamir.PRIME.to_bytes(33, "big"), b"\x00" * 32, b"\xff" * 33])
def test_a_share_that_is_not_a_field_element_is_a_reconstruction_error(bad):
    good = shamir.share_to_bytes(5)
    with pytest.raises(ReconstructionError):
        shamir.combine_one((1, 3, 4), [good, bad, good])
