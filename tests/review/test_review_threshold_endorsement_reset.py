"""Review r11 (FINDING, fails today): a replayed dealer message wipes every honest party's
endorsement log, so the server (no colluder at all) gets two contributor lists of ONE aggregation
decrypted and subtracts them: one honest client's update, exactly.

`PaillierClient.receive_verification_keys` builds a fresh `DecryptionParty` (empty `_endorsed`)
each time it is given the dealer's signed `VerificationKeys` message. The message carries no
epoch or nonce and the client does not refuse a second copy, so the server, which relays it,
can replay it between the two lists. docs/paillier-threshold.md lets the server "replay" any
message and claims "Two different contributor lists of one aggregation never both get
decrypted"; its "What remains" names only restarts (a deployment that forgets), not this.
"""

from __future__ import annotations

import numpy as np

from tests.protocols.paillier_helpers import make_paillier_session


def _decrypt_list(session, spec, subs, ids):
    server = session.server(spec)
    for c in ids:
        server.receive(c, subs[c])
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)  # every (honest) party endorses
    responses = {c: session.clients[c].decryption_share(request) for c in ids}
    return coordinator.combine(responses)


def test_replayed_verification_keys_reset_endorsements_and_isolate_an_update():
    session = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    spec = session.spec(length=6)
    subs = session.submissions(spec)  # every client honest, one submission each
    victim = 0
    first = _decrypt_list(session, spec, subs, [0, 1, 2, 3])
    # the lying server relays the dealer's (genuine, signed) verification keys once more
    for client in session.clients.values():
        client.receive_verification_keys(session.keys)
    second = None
    try:
        second = _decrypt_list(session, spec, subs, [1, 2, 3])
    except Exception:  # noqa: BLE001 - a defended implementation refuses here
        pass
    assert second is None, (
        "two lists of one aggregation were decrypted; their difference is client 0's update: "
        f"{np.array_equal(first[:-1] - second[:-1], session.words[victim])}")
