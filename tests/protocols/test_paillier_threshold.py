"""Threshold custody: t key shares decrypt; each party checks what it is asked to decrypt."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.errors import ClientAbort, ProtocolAbort
from protocols.paillier import RoundSpec
from protocols.paillier import client as client_rules
from protocols.paillier.messages import PartialRequest, PartialResponse, Submission, decode, encode
from secagg.errors import InvalidArgumentError
from secagg.paillier import decode_batch, encode_batch
from tests.protocols.paillier_helpers import make_paillier_session


@pytest.fixture
def session():
    return make_paillier_session(5, threshold=3, custody="threshold")


def _collect(session, spec, ids=None):
    server = session.server(spec)
    for c, data in session.submissions(spec, ids).items():
        server.receive(c, data)
    return server


def _shares(session, request, parties):
    return {c + 1: session.clients[c].decryption_share(request) for c in parties}


def test_any_threshold_of_parties_decrypts_the_exact_sum(session):
    spec = session.spec(length=200)
    server = _collect(session, spec, ids=[0, 1, 3, 4])
    request = server.partial_request()
    words = server.combine(_shares(session, request, [4, 0, 3]), parties=5)
    assert np.array_equal(words, session.expected([0, 1, 3, 4]))


def test_too_few_shares_or_a_lying_party_abort_the_round(session):
    spec = session.spec()
    server = _collect(session, spec)
    request = server.partial_request()
    shares = _shares(session, request, [0, 1, 2])
    with pytest.raises(ProtocolAbort, match="need 3"):
        server.combine({1: shares[1], 2: shares[2]}, parties=5)
    response = decode(shares[3], PartialResponse)
    values = decode_batch(response.batch, session.public_key, round_index=spec.sequence,
                          count=server.count)
    lied = encode(PartialResponse(response.sequence, 3, encode_batch(
        session.public_key, spec.sequence, [v * 4 % session.public_key.n_square for v in values])))
    with pytest.raises(ProtocolAbort):
        server.combine({1: shares[1], 2: shares[2], 3: lied}, parties=5)
    with pytest.raises(ProtocolAbort, match="need 3"):  # a share for another party is dropped
        server.combine({1: shares[1], 2: shares[2], 4: shares[3]}, parties=5)


def test_parties_refuse_what_they_cannot_check(session):
    spec = session.spec()
    server = _collect(session, spec)
    request = decode(server.partial_request(), PartialRequest)
    subs = list(request.submissions)
    first = decode(subs[0], Submission)
    tampered = encode(Submission(first.client_id, first.spec_digest,
                                 first.batch[:-1] + bytes([first.batch[-1] ^ 1]), first.signature))
    cases = [
        (client_rules.TOO_FEW, subs[:2]),
        (client_rules.UNAUTHENTICATED, [tampered, *subs[1:]]),
        (client_rules.UNAUTHENTICATED, [subs[0], subs[0], subs[1]]),  # one client counted twice
    ]
    for party, (reason, submissions) in enumerate(cases, start=1):
        with pytest.raises(ClientAbort, match=reason):
            session.clients[party].decryption_share(
                encode(PartialRequest(request.spec, tuple(submissions))))
    party = session.clients[4]
    good = encode(request)
    party.decryption_share(good)
    with pytest.raises(ClientAbort, match=client_rules.BAD_REQUEST):
        party.decryption_share(good)  # each aggregation is helped at most once
    tagged = RoundSpec(spec.sequence + 10, spec.length, spec.slot_bits, spec.word_bound,
                       spec.max_contributions, tagged=True)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        party.decryption_share(encode(PartialRequest(tagged.to_bytes(), request.submissions)))


def test_submissions_for_another_aggregation_are_refused_by_parties(session):
    spec = session.spec()
    server = _collect(session, spec)
    request = decode(server.partial_request(), PartialRequest)
    other = session.spec()
    with pytest.raises(ClientAbort, match=client_rules.UNAUTHENTICATED):
        session.clients[0].decryption_share(encode(PartialRequest(other.to_bytes(),
                                                                  request.submissions)))


def test_dealer_hands_each_share_out_once():
    from protocols.paillier import ThresholdDealer

    dealer = ThresholdDealer(parties=[10, 20, 30], threshold=2, key_bits=512, allow_insecure=True)
    assert dealer.hand_out(20).index == 2
    with pytest.raises(InvalidArgumentError):
        dealer.hand_out(20)
    with pytest.raises(InvalidArgumentError):
        ThresholdDealer(parties=[1, 1], threshold=2, key_bits=512, allow_insecure=True)
