"""Review r11: a searching server under threshold custody whose moves include replaying any
message it has relayed (the dealer's announcement and verification keys) besides the moves of
tests/protocols/test_paillier_threshold_search.py (random lists, endorsers, helpers).

Claim checked (docs/paillier-threshold.md): per aggregation at most one contributor list is ever
decrypted. FINDING (fails today): the search finds two lists of one aggregation decrypted, with no
corrupt client or party at all, as soon as a replay of the verification keys is among its moves.
The control search without replay moves passes (defended).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from tests.protocols.paillier_helpers import make_paillier_session

N, T = 4, 2


def _search(seed: int, *, replays: bool, steps: int = 14):
    rng = random.Random(seed)
    session = make_paillier_session(N, threshold=T, custody="threshold", key_bits=512)
    announcement = session.dealer.announcement()
    spec = session.spec(length=3)
    subs = session.submissions(spec, seed=seed)
    decrypted: dict[tuple[int, ...], np.ndarray] = {}
    for _ in range(steps):
        move = rng.random()
        if replays and move < 0.25:
            for c in rng.sample(range(N), rng.randint(1, N)):
                try:
                    session.clients[c].receive_announcement(announcement)
                    session.clients[c].receive_verification_keys(session.keys)
                except ClientAbort:
                    pass
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


@pytest.mark.parametrize("replays", [False, True], ids=["control-defended", "with-replays-FINDING"])
def test_searching_server_never_decrypts_two_lists_of_one_aggregation(replays):
    for seed in range(12):
        session, decrypted = _search(seed, replays=replays)
        if len(decrypted) > 1:
            (a, wa), (b, wb) = sorted(decrypted.items(), key=lambda kv: len(kv[0]))[-2:]
            pytest.fail(f"seed {seed}: lists {a} and {b} of one aggregation both decrypted; "
                        f"their difference is the sum of {sorted(set(b) ^ set(a))}")
