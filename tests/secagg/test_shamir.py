import os
import random

import numpy as np
import pytest
from fedsec.secagg import shamir
from fedsec.secagg.errors import InvalidArgumentError, ReconstructionError
from hypothesis import given
from hypothesis import strategies as st


def naive_lagrange(xs):
    p = shamir.PRIME
    out = []
    for j in xs:
        num = den = 1
        for m in xs:
            if m != j:
                num = num * m % p
                den = den * (m - j) % p
        out.append(num * pow(den, -1, p) % p)
    return out


@given(xs=st.sets(st.integers(1, 400), min_size=1, max_size=40))
def test_closed_form_lagrange_matches_the_definition(xs):
    xs = tuple(sorted(xs, key=lambda _: random.random()))
    assert list(shamir.lagrange_at_zero(xs)) == naive_lagrange(xs)


@given(n=st.integers(1, 30), data=st.data(), secrets_=st.lists(st.binary(min_size=32, max_size=32),
                                                                min_size=1, max_size=3))
def test_any_t_shares_reconstruct(n, data, secrets_):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n, unique=True))
    shares = shamir.split(secrets_, threshold=t, xs=xs)
    assert shares.shape == (len(secrets_), n)
    pick = data.draw(st.lists(st.integers(0, n - 1), min_size=t, max_size=t, unique=True))
    assert shamir.combine([xs[i] for i in pick], shares[:, pick]) == secrets_


def test_fewer_than_t_shares_do_not_reveal_the_secret():
    secret = os.urandom(32)
    shares = shamir.split([secret], threshold=5, xs=range(1, 10))
    weights = np.array(shamir.lagrange_at_zero((1, 2, 3, 4)), dtype=object)
    value = int(weights.dot(shares[0, :4]) % shamir.PRIME)
    assert value != int.from_bytes(secret, "big")


def test_secrets_of_all_ones_and_zeros_fit_the_field():
    for secret in (bytes(32), b"\xff" * 32):
        shares = shamir.split([secret], threshold=3, xs=[5, 6, 7])
        assert shamir.combine([7, 5, 6], shares[:, [2, 0, 1]]) == [secret]
        assert all(0 <= int(s) < shamir.PRIME for s in shares[0])


def test_share_bytes_round_trip_and_reject_non_field_elements():
    assert shamir.share_from_bytes(shamir.share_to_bytes(shamir.PRIME - 1)) == shamir.PRIME - 1
    with pytest.raises(ReconstructionError):
        shamir.share_from_bytes(shamir.PRIME.to_bytes(33, "big"))
    with pytest.raises(ReconstructionError):
        shamir.share_from_bytes(b"\x01" * 32)


@pytest.mark.parametrize("kw", [dict(threshold=0, xs=[1, 2]), dict(threshold=3, xs=[1, 2]),
                                dict(threshold=1, xs=[0, 1]), dict(threshold=1, xs=[])])
def test_bad_split_arguments(kw):
    with pytest.raises(InvalidArgumentError):
        shamir.split([bytes(32)], **kw)


def test_bad_combine_arguments():
    shares = shamir.split([bytes(32)], threshold=2, xs=[1, 2])
    with pytest.raises(ReconstructionError):
        shamir.combine([1, 1], shares)
    with pytest.raises(ReconstructionError):
        shamir.combine([1, 2, 3], shares)
    with pytest.raises(InvalidArgumentError):
        shamir.split([b"short"], threshold=1, xs=[1])


@given(t=st.integers(1, 20), data=st.data())
def test_combine_one_matches_combine(t, data):
    secret = data.draw(st.binary(min_size=32, max_size=32))
    xs = list(range(1, t + 4))
    shares = shamir.split([secret], threshold=t, xs=xs)
    pick = sorted(data.draw(st.lists(st.integers(0, t + 2), min_size=t, max_size=t, unique=True)))
    chosen = tuple(xs[i] for i in pick)
    raw = [shamir.share_to_bytes(int(shares[0, i])) for i in pick]
    assert shamir.combine_one(chosen, raw) == secret == shamir.combine(list(chosen), shares[:, pick])[0]
