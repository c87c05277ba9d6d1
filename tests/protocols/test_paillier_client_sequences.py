"""A client's aggregation sequence numbers: per Paillier key, and never more than
MAX_SEQUENCE_GAP ahead, so no spec locks a client out and a key rotation starts afresh.

Adversary: the server, sending clients any spec (specs are not signed), in both custodies, against
unmodified `PaillierClient`s and `PaillierKeyHolder`. Review r11 found (a) one spec with sequence
2^64 - 1 locked a client out for the key's lifetime, and (b) after a key rotation (the new key
holder accepts sequence 1 first) every client refused sequence 1 until the server void-burned as
many numbers as the old key had used.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.paillier import PaillierKeyHolder, RoundSpec
from fedsec.protocols.paillier.client import MAX_SEQUENCE_GAP, REPLAY, SEQUENCE_JUMP
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.secagg.paillier import slot_bits_for

from tests.protocols.paillier_helpers import WORD_BOUND, make_paillier_session


@pytest.mark.parametrize("custody", ["key_holder", "threshold"])
@pytest.mark.parametrize("probe", [(1 << 64) - 1, 1 << 63, MAX_SEQUENCE_GAP + 1])
def test_a_huge_sequence_number_is_refused_and_locks_nobody_out(custody, probe):
    session = make_paillier_session(3, threshold=2, custody=custody, key_bits=512)
    honest = session.spec(length=4)
    words = np.zeros(honest.length - 1, dtype=np.uint64)
    with pytest.raises(ClientAbort, match=SEQUENCE_JUMP):
        session.clients[0].submit(replace(honest, sequence=probe).to_bytes(), words, roster=session.names)
    # the real aggregation still goes in
    session.clients[0].submit(honest.to_bytes(), words, roster=session.names)


def test_the_gap_bound_is_exactly_max_sequence_gap():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    spec = session.spec(length=4)
    words = np.zeros(spec.length - 1, dtype=np.uint64)
    client = session.clients[0]
    client.submit(replace(spec, sequence=MAX_SEQUENCE_GAP).to_bytes(), words, roster=session.names)
    with pytest.raises(ClientAbort, match=SEQUENCE_JUMP):
        client.submit(replace(spec, sequence=2 * MAX_SEQUENCE_GAP + 1).to_bytes(), words,
                      roster=session.names)
    with pytest.raises(ClientAbort, match=REPLAY):
        client.submit(replace(spec, sequence=MAX_SEQUENCE_GAP).to_bytes(), words, roster=session.names)
    client.submit(replace(spec, sequence=2 * MAX_SEQUENCE_GAP).to_bytes(), words, roster=session.names)


def test_a_searching_server_never_locks_a_client_out():
    """Random specs (any u64 number; old, repeated, near or far ahead): afterwards the next
    number after the last one the client took is always accepted, and nothing ever went in twice
    or went backwards."""
    rng = random.Random(5)
    session = make_paillier_session(3, threshold=2, key_bits=512)
    spec = session.spec(length=4)
    words = np.zeros(spec.length - 1, dtype=np.uint64)
    client, taken = session.clients[0], []
    for _ in range(200):
        last = taken[-1] if taken else 0
        sequence = rng.choice([rng.randrange(1 << 64), last, max(last - 1, 1), last + 1,
                               last + rng.randrange(1, 2 * MAX_SEQUENCE_GAP),
                               last + MAX_SEQUENCE_GAP, last + MAX_SEQUENCE_GAP + 1])
        if not 0 <= sequence < 1 << 64:
            continue
        try:
            client.submit(replace(spec, sequence=sequence).to_bytes(), words, roster=session.names)
            taken.append(sequence)
        except ClientAbort as abort:
            assert abort.reason in (REPLAY, SEQUENCE_JUMP)
            assert (sequence <= last) == (abort.reason == REPLAY)
    assert taken == sorted(set(taken))
    assert all(b - a <= MAX_SEQUENCE_GAP for a, b in zip([0, *taken], taken, strict=False))
    client.submit(replace(spec, sequence=taken[-1] + 1).to_bytes(), words, roster=session.names)


def _aggregate(session, spec):
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    return server.finish(session.key_holder.decrypt(server.decryption_request()))


def test_after_a_key_rotation_the_first_aggregation_is_accepted_and_decrypted():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    for _ in range(3):  # three aggregations under the first key
        _aggregate(session, session.spec(length=4))
    old = session.key_holder
    rotated = PaillierKeyHolder(threshold=2, key_bits=512, server_identity=old.server_identity,
                                identity=old.identity, epoch=2, allow_insecure=True)
    for c, client in session.clients.items():
        rotated.enroll(c, session.identities[c].public)
        client.receive_welcome(rotated.register(client.receive_announcement(rotated.announcement())))
    assert rotated.last_sequence == 0
    session.key_holder, session.sequence = rotated, 0
    spec = session.spec(length=4)
    assert spec.sequence == 1
    assert np.array_equal(_aggregate(session, spec), session.expected(range(3)))


def test_a_new_epoch_with_the_same_key_keeps_the_counter():
    """The key holder's burned numbers are per key id, so the client's are too: an announcement
    of a new epoch for the same key does not reopen old numbers."""
    session = make_paillier_session(3, threshold=2, key_bits=512)
    _aggregate(session, session.spec(length=4))
    old = session.key_holder
    again = PaillierKeyHolder(threshold=2, server_identity=old.server_identity,
                              identity=old.identity, epoch=2, private_key=old._private_key,
                              store=old.store)
    client = session.clients[0]
    again.enroll(0, session.identities[0].public)
    client.receive_welcome(again.register(client.receive_announcement(again.announcement())))
    spec = RoundSpec(sequence=1, length=5, slot_bits=slot_bits_for(WORD_BOUND, 3),
                     word_bound=WORD_BOUND, max_contributions=3, roster=roster_digest(session.names))
    with pytest.raises(ClientAbort, match=REPLAY):
        client.submit(spec.to_bytes(), np.zeros(4, dtype=np.uint64), roster=session.names)
