"""Chunked framing: round trips at any size, and a tampering adversary never gets a wrong payload."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.network import framing
from fedsec.network.errors import MalformedFrame


@settings(max_examples=30, deadline=None)
@given(size=st.sampled_from([0, 1, framing.CHUNK_BYTES - 1, framing.CHUNK_BYTES, framing.CHUNK_BYTES + 1,
                             3 * framing.CHUNK_BYTES + 7]), topic=st.text(min_size=1, max_size=40))
def test_round_trip_and_no_message_exceeds_the_limit(size, topic):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    messages = list(framing.frames(topic, payload))
    assert all(len(m) <= framing.MESSAGE_MAX for m in messages)
    assert len(messages) == 1 + -(-size // framing.CHUNK_BYTES)
    assert framing.reassemble(messages) == (topic, payload)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tampered_streams_are_refused_never_misread(data):
    """Searching adversary on the wire: flip, drop, duplicate, truncate or append messages."""
    payload = data.draw(st.binary(min_size=0, max_size=3000))
    header = next(framing.frames("update", payload))
    # the payload in small chunks, so that edits can hit individual ones
    small = [header] + [payload[i:i + 500] for i in range(0, len(payload), 500)]
    action = data.draw(st.sampled_from(["flip", "drop", "duplicate", "truncate", "append"]))
    index = data.draw(st.integers(0, len(small) - 1))
    edited = [bytearray(m) for m in small]
    if action == "flip" and len(edited[index]):
        edited[index][data.draw(st.integers(0, len(edited[index]) - 1))] ^= data.draw(st.integers(1, 255))
    elif action == "drop":
        del edited[index]
    elif action == "duplicate":
        edited.insert(index, bytearray(edited[index]))
    elif action == "truncate" and len(edited[index]):
        edited[index] = edited[index][:-1]
    elif action == "append":
        edited.append(bytearray(data.draw(st.binary(min_size=1, max_size=10))))
    try:
        topic, got = framing.reassemble(bytes(m) for m in edited)
    except MalformedFrame:
        return
    assert (topic, hashlib.sha256(got).digest()) == ("update", hashlib.sha256(payload).digest())
    assert got == payload


def test_oversized_announcement_refused_before_reading_chunks():
    header = next(framing.frames("big", b"x" * 100))

    def chunks():
        yield header
        raise AssertionError("a chunk was read after an oversized header")

    with pytest.raises(MalformedFrame, match="exceeds the limit"):
        framing.reassemble(chunks(), max_payload=99)
    with pytest.raises(MalformedFrame):
        framing.reassemble([header, b"x" * (framing.CHUNK_BYTES + 1)])
    with pytest.raises(MalformedFrame):
        framing.reassemble([])
    with pytest.raises(ValueError, match="topic"):
        next(framing.frames("", b""))


@settings(max_examples=30, deadline=None)
@given(size=st.sampled_from([0, 1, 1000, framing.MESSAGE_MAX - 64]), topic=st.text(min_size=1, max_size=40))
def test_single_message_round_trip_and_its_limit(size, topic):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    message = framing.single(topic, payload)
    if message is None:
        assert len(next(framing.frames(topic, b""))) + size > framing.MESSAGE_MAX
        return
    assert len(message) <= framing.MESSAGE_MAX
    assert framing.unpack([message]) == (topic, payload)
    assert framing.single(topic, b"x" * framing.MESSAGE_MAX) is None


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tampered_single_messages_are_refused_never_misread(data):
    """Searching adversary on the wire against the unary path: flip, truncate, extend, split, repeat."""
    payload = data.draw(st.binary(min_size=0, max_size=2000))
    message = bytearray(framing.single("update", payload))
    action = data.draw(st.sampled_from(["flip", "truncate", "extend", "split", "repeat"]))
    index = data.draw(st.integers(0, len(message) - 1))
    if action == "flip":
        message[index] ^= data.draw(st.integers(1, 255))
        messages = [bytes(message)]
    elif action == "truncate":
        messages = [bytes(message[:index])]
    elif action == "extend":
        messages = [bytes(message) + data.draw(st.binary(min_size=1, max_size=10))]
    elif action == "split":
        messages = [bytes(message[:index]), bytes(message[index:])]
    else:
        messages = [bytes(message), bytes(message)]
    with pytest.raises(MalformedFrame):  # every edit changes the bytes: none may be accepted
        framing.unpack(messages)


def test_unpack_refuses_an_announcement_over_the_limit_and_an_empty_call():
    with pytest.raises(MalformedFrame, match="exceeds the limit"):
        framing.unpack([framing.single("big", b"x" * 100)], max_payload=99)
    with pytest.raises(MalformedFrame):
        framing.unpack([])
