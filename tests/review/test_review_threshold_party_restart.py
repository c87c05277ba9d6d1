"""Review r11 (FINDING, medium; fails today; the limitation is DOCUMENTED in
docs/paillier-threshold.md "What remains", but nothing lets a deployment fix it): a party that
restarts (a new `DecryptionParty` from the same share, directory and identity, as any process
restart does) has forgotten its endorsements, and `DecryptionParty` has no store argument
(unlike the key holder's `SequenceStore`), so "a deployment must persist it" cannot be done
without changing the class. With every party restarted once, the server (no colluder)
decrypts two lists of one aggregation and isolates an honest update.
"""

from __future__ import annotations

import inspect

import pytest

from protocols.errors import ClientAbort
from protocols.paillier.party import DecryptionParty
from tests.protocols.paillier_helpers import make_paillier_session


def test_decryption_party_offers_a_persistence_seam_for_its_endorsements():
    assert "store" in inspect.signature(DecryptionParty).parameters


def test_restarted_parties_refuse_a_second_list_of_one_aggregation():
    session = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    spec = session.spec(length=4)
    subs = session.submissions(spec)

    def decrypt(ids):
        server = session.server(spec)
        for c in ids:
            server.receive(c, subs[c])
        coordinator = session.coordinator(server)
        request = session.certify(coordinator)
        return coordinator.combine({c: session.clients[c].decryption_share(request) for c in ids})

    first = decrypt([0, 1, 2, 3])
    for c, client in session.clients.items():  # a process restart of every party
        old = client._party
        client._party = DecryptionParty(c, identity=session.identities[c], share=old._share,
                                        roster=old._roster, directory=old.directory)
    try:
        second = decrypt([1, 2, 3])
    except ClientAbort:
        return
    pytest.fail(f"restarted parties decrypted a second list; difference = client 0's words: "
                f"{(first[:-1] - second[:-1]).tolist()} == {session.words[0].tolist()}")
