"""The server's array readings of client messages equal the scalar references they replace.

``UnmaskShares`` and ``SharedBundles`` must accept exactly the bytes ``UnmaskResponse`` and
``ShareKeys`` accept, with the same contents, and refuse everything else with the same reason (a
searching sender may send any bytes); the router fed those records must forward the same bytes;
``ShareHasher.digest_rows`` must equal ``share_hash`` share by share; the field-element test on
rows must equal the integer comparison."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import ShareHasher, share_hash
from fedsec.protocols.masked.server import _at_least_prime
from fedsec.secagg.shamir import PRIME, SHARE_BYTES
from hypothesis import given
from hypothesis import strategies as st

SESSION = b"s" * 16
HEADER = m.Header(m.UnmaskResponse.KIND, SESSION, 3, 17, m.SERVER)

shares = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 1),
                            st.binary(min_size=SHARE_BYTES, max_size=SHARE_BYTES)), max_size=12)


def _outcome(data: bytes, expect: type) -> object:
    try:
        _, body = m.decode(data, expect=expect, session=SESSION, round_index=3, sender=17)
    except MalformedMessage as error:
        return "refused", str(error)
    if isinstance(body, m.UnmaskShares):
        return [(int(o), int(k), bytes(s.tobytes())) for o, k, s in zip(body.owners, body.kinds, body.shares,
                                                                        strict=True)]
    return [tuple(row) for row in body.shares]


@given(shares, st.data())
def test_array_reading_equals_the_tuple_reading_on_any_bytes(rows, data):
    message = m.encode(HEADER, m.UnmaskResponse(tuple(rows)))
    edit = data.draw(st.sampled_from(["none", "truncate", "extend", "kind", "count", "byte"]))
    raw = bytearray(message)
    body_start = len(message) - 4 - len(rows) * (8 + 1 + SHARE_BYTES)
    if edit == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif edit == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=50))
    elif edit == "kind" and rows:
        i = data.draw(st.integers(0, len(rows) - 1))
        raw[body_start + 4 + i * (9 + SHARE_BYTES) + 8] = data.draw(st.integers(0, 255))
    elif edit == "count":
        raw[body_start:body_start + 4] = data.draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    elif edit == "byte" and len(raw) > body_start:
        raw[data.draw(st.integers(body_start, len(raw) - 1))] = data.draw(st.integers(0, 255))
    assert _outcome(bytes(raw), m.UnmaskShares) == _outcome(bytes(raw), m.UnmaskResponse)


@given(st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1),
       st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(1, 2**20), st.integers(0, 1),
                          st.binary(min_size=SHARE_BYTES, max_size=SHARE_BYTES)), max_size=12))
def test_digest_rows_equal_one_share_hash_each(session, round_index, rows):
    hasher = ShareHasher(session, round_index)
    owners = np.array([r[0] for r in rows], dtype=np.uint64)
    xs = np.array([r[1] for r in rows], dtype=np.int64)
    kinds = np.array([r[2] for r in rows], dtype=np.int64)
    points = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.uint8).reshape(len(rows), SHARE_BYTES)
    expected = [share_hash(session, round_index, o, x, k, s) for o, x, k, s in rows]
    for _ in range(2):  # the second call uses the kept common prefix
        got = hasher.digest_rows(owners, xs, kinds, points)
        assert got.shape == (len(rows), 32)
        assert [bytes(row.tobytes()) for row in got] == expected


near_prime = st.integers(-2**20, 2**20).map(lambda d: PRIME + d)
values = st.one_of(st.integers(0, 2**264 - 1), near_prime.filter(lambda v: 0 <= v < 2**264),
                   st.sampled_from([0, PRIME - 1, PRIME, PRIME + 1, 2**256, 2**264 - 1]))


@given(st.lists(values, max_size=20))
def test_field_element_test_on_rows_equals_the_integer_comparison(ints):
    rows = np.frombuffer(b"".join(v.to_bytes(SHARE_BYTES, "big") for v in ints),
                         dtype=np.uint8).reshape(len(ints), SHARE_BYTES)
    assert _at_least_prime(rows).tolist() == [v >= PRIME for v in ints]


def test_a_duplicated_owner_is_refused_even_with_the_right_count():
    from fedsec.protocols.masked.server import _Unmask

    stage = _Unmask.__new__(_Unmask)
    stage.asked = {7: (np.array([1, 2], dtype=np.uint64), np.array([0, 1]))}
    body = m.UnmaskShares(np.array([1, 1], dtype=np.uint64), np.array([0, 0]),
                          np.zeros((2, SHARE_BYTES), dtype=np.uint8))
    with pytest.raises(MalformedMessage, match="exactly what was asked"):
        stage.accept(7, body)


bundles = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(min_size=m.SEALED_BYTES,
                                                                  max_size=m.SEALED_BYTES)), max_size=6)


def _bundles_outcome(data: bytes, expect: type) -> object:
    try:
        _, body = m.decode(data, expect=expect, session=SESSION, round_index=3, sender=17)
    except MalformedMessage as error:
        return "refused", str(error)
    if isinstance(body, m.SharedBundles):
        return [(int(row["peer"]), bytes(row["bundle"])) for row in body.rows], body.commitments
    return [tuple(row) for row in body.sealed], body.commitments


@given(bundles, st.binary(max_size=200), st.data())
def test_bundle_reading_equals_the_tuple_reading_on_any_bytes(rows, commitments, data):
    header = m.Header(m.ShareKeys.KIND, SESSION, 3, 17, m.SERVER)
    raw = bytearray(m.encode(header, m.ShareKeys(tuple(rows), commitments)))
    edit = data.draw(st.sampled_from(["none", "truncate", "extend", "byte"]))
    if edit == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif edit == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=50))
    elif edit == "byte":
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    assert _bundles_outcome(bytes(raw), m.SharedBundles) == _bundles_outcome(bytes(raw), m.ShareKeys)


@given(st.integers(4, 12), st.data())
def test_router_fed_records_forwards_the_same_bytes(n, data):
    from fedsec.protocols.masked.graph import RingGraph
    from fedsec.protocols.masked.routing import BundleRouter

    ring = tuple(data.draw(st.permutations(range(1, n + 1))))
    degree = data.draw(st.sampled_from([d for d in range(2, n) if d % 2 == 0] or [n - 1]))
    graph = RingGraph(ring, degree)
    by_bytes, by_rows = BundleRouter(graph), BundleRouter(graph)
    for sender in ring:
        peers = list(graph.neighbours(sender))
        peers = data.draw(st.permutations(peers))[:data.draw(st.integers(0, len(peers)))]
        blobs = [data.draw(st.binary(min_size=m.SEALED_BYTES, max_size=m.SEALED_BYTES)) for _ in peers]
        by_bytes.add(sender, np.array(peers, dtype=np.uint64), b"".join(blobs))
        raw = m.encode(m.Header(m.ShareKeys.KIND, SESSION, 3, sender, m.SERVER),
                       m.ShareKeys(tuple(zip(peers, blobs, strict=True)), b""))
        _, body = m.decode(raw, expect=m.SharedBundles)
        by_rows.add_rows(sender, body.rows)
    by_bytes.seal()
    by_rows.seal()
    for c in ring:
        assert b"".join(by_rows.body(c)) == b"".join(by_bytes.body(c))
