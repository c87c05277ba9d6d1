"""The server's messages built from parts serialised once equal the simple encoding, byte for byte."""

from __future__ import annotations

import os

import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.framing import KeyListBodies, UnmaskRequestBodies, body_bytes, frame
from hypothesis import given
from hypothesis import strategies as st

SESSION = bytes(range(16))
ids = st.integers(0, 2**64 - 1)
raw32 = st.binary(min_size=32, max_size=32)
signature = st.binary(min_size=64, max_size=64)


def _simple(recipient: int, body: m.Body, round_index: int = 5) -> bytes:
    return m.encode(m.Header(0, SESSION, round_index, m.SERVER, recipient), body)


@st.composite
def key_entries(draw, signed: bool):
    clients = draw(st.lists(ids, min_size=1, max_size=12, unique=True))
    return {c: m.KeyEntry(c, draw(raw32), draw(raw32), draw(raw32), draw(signature) if signed else b"")
            for c in clients}


@given(st.booleans().flatmap(key_entries), st.data(), ids)
def test_key_list_bodies_equal_the_simple_encoding(entries, data, recipient):
    chosen = data.draw(st.lists(st.sampled_from(sorted(entries)), unique=True))
    built = frame(m.KeyList.KIND, SESSION, 5, recipient, KeyListBodies(entries).body(chosen))
    assert built == _simple(recipient, m.KeyList(tuple(entries[c] for c in chosen)))
    assert m.decode(built, expect=m.KeyList)[1].entries == tuple(entries[c] for c in chosen)


def test_key_entries_mixing_signed_and_unsigned_are_refused():
    entries = {1: m.KeyEntry(1, b"a" * 32, b"b" * 32, b"c" * 32, b"s" * 64),
               2: m.KeyEntry(2, b"d" * 32, b"e" * 32, b"f" * 32, b"")}
    with pytest.raises(MalformedMessage):
        KeyListBodies(entries)


@given(st.lists(st.tuples(ids, signature), max_size=8),
       st.dictionaries(ids, st.tuples(st.binary(min_size=3, max_size=3), signature), max_size=6),
       st.lists(ids, max_size=8, unique=True), st.lists(ids, max_size=8, unique=True), st.data(), ids,
       st.integers(0, 2**64 - 1))
def test_unmask_request_bodies_equal_the_simple_encoding(signatures, attestations, alive, dropped, data,
                                                          recipient, round_index):
    attested = data.draw(st.lists(st.sampled_from(sorted(attestations)), unique=True)) if attestations else []
    body = UnmaskRequestBodies(signatures, attestations).body(alive, dropped, attested)
    simple = m.UnmaskRequest(tuple(alive), tuple(dropped), tuple(signatures),
                             tuple((v, *attestations[v]) for v in attested))
    built = frame(m.UnmaskRequest.KIND, SESSION, round_index, recipient, body)
    assert built == _simple(recipient, simple, round_index)
    assert m.decode(built, expect=m.UnmaskRequest)[1] == simple


def test_unmask_request_bodies_refuse_what_the_simple_encoding_refuses():
    with pytest.raises(MalformedMessage):
        UnmaskRequestBodies([(1, b"short")], {})
    with pytest.raises(MalformedMessage):
        UnmaskRequestBodies([], {1: (b"ab", b"s" * 64), 2: (b"abc", b"s" * 64)})


@given(st.lists(ids, min_size=1, max_size=20, unique=True), ids)
def test_broadcast_bodies_equal_the_simple_encoding(survivors, recipient):
    params = m.SessionParams(tuple(survivors), 2, 2, 10, 1.0, 8, 50, 3, 10, True, 0)
    for body in (params, m.ConsistencyRequest(tuple(survivors))):
        assert frame(body.KIND, SESSION, 5, recipient, body_bytes(body)) == _simple(recipient, body)


def test_a_session_id_of_the_wrong_size_is_refused_not_padded():
    with pytest.raises(MalformedMessage):
        frame(m.ConsistencyRequest.KIND, os.urandom(15), 1, 2, b"")
