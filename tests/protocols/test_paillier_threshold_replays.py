"""Threshold custody: replays of the dealer's messages and party restarts never let two
contributor lists of one aggregation both decrypt.

Adversary: the server, relaying every message, replaying any of them (the dealer's announcement
and its signed verification keys) at any time, with no corrupt client; and a deployment that
rebuilds or restarts a party. Honest parties are unmodified `PaillierClient`s / `DecryptionParty`s.
Two decrypted lists of one aggregation would differ by honest updates (review r11: the replayed
verification keys rebuilt every party with an empty endorsement log, and the server isolated one
update). A client now takes the verification keys once per (key id, epoch) and a party records
its endorsements in an `EndorsementStore` that outlives the party object.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.client import OTHER_KEYS
from fedsec.protocols.paillier.party import CONFLICT, DecryptionParty
from fedsec.protocols.paillier.state import MemoryEndorsementStore

from tests.protocols.paillier_helpers import make_paillier_session

N, T = 4, 2


def _decrypt_list(session, spec, subs, ids):
    server = session.server(spec)
    for c in ids:
        server.receive(c, subs[c])
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)  # every (honest) party is asked to endorse
    responses = {c: session.clients[c].decryption_share(request) for c in ids}
    return coordinator.combine(responses)


def test_replayed_verification_keys_change_nothing_and_the_second_list_is_refused():
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    spec = session.spec(length=6)
    subs = session.submissions(spec)
    first = _decrypt_list(session, spec, subs, [0, 1, 2, 3])
    assert np.array_equal(first, session.expected([0, 1, 2, 3]))
    parties = {c: client._party for c, client in session.clients.items()}
    for client in session.clients.values():  # the server relays the dealer's keys once more
        assert client.receive_announcement(session.dealer.announcement()) is None
        client.receive_verification_keys(session.keys)
    assert all(session.clients[c]._party is parties[c] for c in parties)  # never rebuilt
    with pytest.raises(ClientAbort, match=CONFLICT):
        _decrypt_list(session, spec, subs, [1, 2, 3])


def test_different_verification_keys_for_the_same_key_and_epoch_are_refused():
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    message = tm.decode(session.keys, tm.VerificationKeys)
    # the same key and threshold, the parties listed in another order, validly signed by the dealer
    reordered = tm.VerificationKeys(message.key_id, message.threshold, message.parties[::-1],
                                    message.base, message.keys[::-1])
    signature = session.dealer.identity.sign(tm.KEYS_DOMAIN + reordered.signed_part())
    data = tm.encode(tm.VerificationKeys(reordered.key_id, reordered.threshold, reordered.parties,
                                         reordered.base, reordered.keys, signature))
    party = session.clients[0]._party
    with pytest.raises(ClientAbort, match=OTHER_KEYS):
        session.clients[0].receive_verification_keys(data)
    assert session.clients[0]._party is party


def test_a_party_rebuilt_on_the_same_store_refuses_a_second_list():
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    spec = session.spec(length=4)
    subs = session.submissions(spec)
    _decrypt_list(session, spec, subs, [0, 1, 2, 3])
    for c, client in session.clients.items():  # a process restart of every party, same store
        old = client._party
        client._party = DecryptionParty(c, identity=session.identities[c], share=old._share,
                                        roster=old._roster, directory=old.directory,
                                        store=old.store)
    with pytest.raises(ClientAbort, match=CONFLICT):
        _decrypt_list(session, spec, subs, [1, 2, 3])


def test_a_party_without_a_store_argument_keeps_its_endorsements_in_memory():
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    party = session.clients[0]._party
    assert isinstance(party.store, MemoryEndorsementStore)


def _search(seed: int, *, replays: bool, steps: int = 14):
    """A server that randomly picks lists, endorsers and helpers, and (with ``replays``) replays
    the dealer's announcement and verification keys to random parties between steps."""
    rng = random.Random(seed)
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    announcement = session.dealer.announcement()
    spec = session.spec(length=3)
    subs = session.submissions(spec, seed=seed)
    decrypted: dict[tuple[int, ...], np.ndarray] = {}
    for _ in range(steps):
        if replays and rng.random() < 0.25:
            for c in rng.sample(range(N), rng.randint(1, N)):
                session.clients[c].receive_announcement(announcement)
                session.clients[c].receive_verification_keys(session.keys)
            continue
        ids = tuple(sorted(rng.sample(range(N), rng.randint(T, N))))
        server = session.server(spec)
        for c in ids:
            server.receive(c, subs[c])
        coordinator = session.coordinator(server)
        listing = coordinator.contributor_list()
        for party in rng.sample(range(N), rng.randint(1, N)):
            try:
                coordinator.add_endorsement(party, session.clients[party].endorse(listing))
            except ClientAbort:
                pass
        try:
            request = coordinator.request()
        except ProtocolAbort:
            continue
        responses = {}
        for party in rng.sample(list(ids), len(ids)):
            try:
                responses[party] = session.clients[party].decryption_share(request)
            except ClientAbort:
                pass
        try:
            decrypted[ids] = coordinator.combine(responses)
        except (ProtocolAbort, MalformedMessage):
            pass
    return session, decrypted


@pytest.mark.parametrize("replays", [False, True], ids=["no-replays", "with-replays"])
def test_searching_server_never_decrypts_two_lists_of_one_aggregation(replays):
    found_one = 0
    for seed in range(12):
        session, decrypted = _search(seed, replays=replays)
        assert len(decrypted) <= 1, f"seed {seed}: lists {sorted(decrypted)} of one aggregation"
        for ids, words in decrypted.items():
            assert np.array_equal(words, session.expected(ids))
        found_one += len(decrypted)
    assert found_one > 0  # the search does reach decryption
