"""Key-holder custody: registrations are bound to the key epoch, and the key holder's own
refusal record is bounded.

Adversary: the server (which relays registrations) replaying a client's old signed registration
to a key holder that moved to a new epoch of the same key; anyone flooding the key holder with
junk requests. Unmodified `PaillierClient` and `PaillierKeyHolder`.
"""

from __future__ import annotations

import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.paillier import PaillierKeyHolder
from fedsec.protocols.paillier.keyholder import REFUSAL, REFUSAL_RECORD
from fedsec.protocols.paillier.messages import Registration, decode, encode

from tests.protocols.paillier_helpers import make_paillier_session


def test_a_replayed_registration_of_an_older_epoch_is_refused():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    old = session.key_holder
    client = session.clients[0]
    stale = client._registration
    assert decode(stale, Registration).epoch == 1
    again = PaillierKeyHolder(threshold=2, server_identity=old.server_identity,
                              identity=old.identity, epoch=2, private_key=old._private_key)
    again.enroll(0, session.identities[0].public)
    with pytest.raises(MalformedMessage, match="epoch"):
        again.register(stale)
    fresh = client.receive_announcement(again.announcement())
    assert decode(fresh, Registration).epoch == 2
    client.receive_welcome(again.register(fresh))


def test_an_altered_registration_epoch_does_not_verify():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    holder = session.key_holder
    message = decode(session.clients[1]._registration, Registration)
    forged = Registration(message.client_id, message.key_id, message.tag_public, message.signature,
                          epoch=2)
    holder.epoch = 2  # even a key holder at that epoch refuses: the epoch is signed
    with pytest.raises(MalformedMessage, match="does not verify"):
        holder.register(encode(forged))


def test_the_refusal_record_keeps_only_the_last_ones():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    holder = session.key_holder
    for i in range(REFUSAL_RECORD + 50):
        assert holder.respond(i.to_bytes(4, "big")) == REFUSAL
    assert len(holder.refusals) == REFUSAL_RECORD
    assert holder.refusals[-1] == (None, "malformed, or not signed by the server")
