"""The server's share hasher equals the commitment the clients compute."""

from __future__ import annotations

from fedsec.protocols.masked.keys import ShareHasher, share_hash
from hypothesis import given
from hypothesis import strategies as st


@given(st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1),
       st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(1, 2**20), st.integers(0, 1),
                          st.binary(min_size=33, max_size=33)), max_size=8))
def test_share_hasher_equals_share_hash(session, round_index, shares):
    hasher = ShareHasher(session, round_index)
    for owner, x, kind, share in shares + shares:  # the second pass uses the kept prefixes
        assert hasher.digest(owner, x, kind, share) == share_hash(session, round_index, owner, x, kind, share)


@given(st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 2**20), st.integers(0, 1),
                          st.binary(min_size=33, max_size=33)), max_size=12))
def test_share_hasher_digests_equal_one_share_hash_each(session, round_index, shares):
    hasher = ShareHasher(session, round_index)
    owners, xs, kinds, values = zip(*shares, strict=True) if shares else ((), (), (), ())
    expected = b"".join(share_hash(session, round_index, o, x, k, s) for o, x, k, s in shares)
    assert hasher.digests(owners, xs, kinds, values) == expected
    assert hasher.digests(owners, xs, kinds, values) == expected  # with every prefix kept
