"""A restarted client's old registration, replayed in the same key epoch, is refused.

Adversary: the server, which keeps every message it relayed. The key holder keeps one tag (pad) key
per client; a client that restarts registers a fresh tag key in the same epoch. Were the server able
to replay the pre-restart registration (signed, this key, this epoch), the key holder would swap the
pad key back and refuse every later aggregation with that honest client in it: a targeted lock-out
behind the opaque refusal. (Found by the second-round review.)
"""

from __future__ import annotations

import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.paillier import PaillierClient

from tests.protocols.paillier_helpers import make_paillier_session


def _round(s, holder):
    spec = s.spec(length=4)
    server = s.server(spec)
    for c, data in s.submissions(spec).items():
        server.receive(c, data)
    return server, holder.respond(server.decryption_request())


def test_a_restarted_clients_old_registration_replayed_in_the_same_epoch_is_refused():
    s = make_paillier_session(3, threshold=2, key_bits=512)
    holder = s.key_holder
    announcement = holder.announcement()
    old_registration = s.clients[0].receive_announcement(announcement)  # the server kept this
    restarted = PaillierClient(0, identity=s.identities[0],
                               announcer_identity=holder.identity.public, min_key_bits=512)
    restarted.receive_welcome(holder.register(restarted.receive_announcement(announcement)))
    s.clients[0] = restarted
    server, answer = _round(s, holder)
    assert (server.finish(answer) == s.expected([0, 1, 2])).all()
    with pytest.raises(MalformedMessage, match="replaced"):
        holder.register(old_registration)
    server, answer = _round(s, holder)
    assert not list(holder.refusals)
    assert (server.finish(answer) == s.expected([0, 1, 2])).all()


def test_the_current_registration_sent_again_is_accepted():
    s = make_paillier_session(3, threshold=2, key_bits=512)
    holder = s.key_holder
    registration = s.clients[1].receive_announcement(holder.announcement())
    holder.register(registration)
    holder.register(registration)
    server, answer = _round(s, holder)
    assert (server.finish(answer) == s.expected([0, 1, 2])).all()
