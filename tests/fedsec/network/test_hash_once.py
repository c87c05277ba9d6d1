"""Each end hashes a message once: the framing digest and the audit row share the payload's SHA-256.

The frame's digest is SHA-256(topic length | topic | SHA-256(payload)); a received payload keeps the
SHA-256 its frame check computed, and the audit row of it records that same digest. The tampering
adversary on the wire is the one of ``test_framing`` (a wrong digest or payload is refused); here:
the digest a receiver keeps is the payload's own, never the sender's claim.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.network import framing
from fedsec.network.errors import MalformedFrame
from fedsec.network.party_audit import message


class Counted:
    """``hashlib.sha256`` counting the calls over more than ``floor`` bytes."""

    def __init__(self, floor: int) -> None:
        self.floor, self.calls, self.real = floor, 0, hashlib.sha256

    def __call__(self, data: bytes = b"") -> object:
        if len(data) > self.floor:
            self.calls += 1
        return self.real(data)


@settings(max_examples=25, deadline=None)
@given(payload=st.binary(max_size=5000), topic=st.text(min_size=1, max_size=30),
       streamed=st.booleans())
def test_a_received_payload_keeps_its_own_digest_and_the_audit_row_records_it(payload, topic, streamed):
    messages = list(framing.frames(topic, payload)) if streamed else [framing.single(topic, payload)]
    got_topic, got = (framing.reassemble if streamed else framing.unpack)(messages)
    assert (got_topic, got) == (topic, payload) and isinstance(got, framing.Payload)
    assert got.sha256() == hashlib.sha256(payload).digest()
    row = message("from", "site", "answer", got)
    assert row == {"from": "site", "kind": "answer", "size": len(payload),
                   "sha256": hashlib.sha256(payload).hexdigest()}


def test_each_end_hashes_a_large_message_once(monkeypatch):
    payload = bytes(range(256)) * 4000  # 1 MB: single() refuses, frames() streams it
    small = payload[:100_000]
    counter = Counted(floor=50_000)
    monkeypatch.setattr(framing.hashlib, "sha256", counter)
    for data, frame, read in ((small, lambda p: [framing.single("job", p)], framing.unpack),
                              (payload, lambda p: list(framing.frames("job", p)), framing.reassemble)):
        counter.calls = 0
        sent = framing.Payload(data)  # the sender: frame and audit row
        wire = frame(sent)
        message("to", "site", "job", sent)
        assert counter.calls == 1
        counter.calls = 0
        _, got = read(wire)  # the receiver: frame check and audit row
        message("from", "coordinator", "job", got)
        assert counter.calls == 1


def test_a_frame_whose_digest_is_over_the_payload_itself_is_refused():
    """A frame digested the ``FSX1`` way (over the payload bytes), even with a valid header layout."""
    payload = b"model bytes" * 100
    name = b"job"
    old = hashlib.sha256(len(name).to_bytes(2, "big") + name + payload).digest()
    forged = framing._FIXED.pack(framing.MAGIC, len(payload), old, len(name)) + name + payload
    with pytest.raises(MalformedFrame):
        framing.unpack([forged])
    with pytest.raises(MalformedFrame):  # and the old magic is not a fedsec frame any more
        framing.unpack([b"FSX1" + forged[4:]])
