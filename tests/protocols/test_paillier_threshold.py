"""Threshold custody: t verified key shares decrypt one endorsed contributor list per aggregation;
each party checks what it is asked to decrypt (signatures, proofs of plaintext knowledge, a quorum)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import RoundSpec, ThresholdDealer
from fedsec.protocols.paillier import client as client_rules
from fedsec.protocols.paillier import party as party_rules
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.binding import quorum
from fedsec.protocols.paillier.coordinator import BAD_PROOF
from fedsec.protocols.paillier.messages import SUBMIT_DOMAIN, Submission, decode, encode
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import decode_batch, encode_batch

from tests.protocols.paillier_helpers import make_paillier_session


@pytest.fixture(scope="module")
def session():
    return make_paillier_session(5, threshold=3, custody="threshold", key_bits=512)


def _collect(session, spec, ids=None):
    server = session.server(spec)
    for c, data in session.submissions(spec, ids).items():
        server.receive(c, data)
    return server


def _shares(session, request, parties):
    return {c: session.clients[c].decryption_share(request) for c in parties}


def test_quorum_makes_two_quorums_share_an_honest_party():
    for n in range(2, 30):
        for t in range(2, n + 1):
            q = quorum(n, t)
            assert q <= n and 2 * q - n > t - 1 and 2 * (q - 1) - n <= t - 1


def test_any_threshold_of_parties_decrypts_the_exact_sum(session):
    spec = session.spec(length=200)
    server = _collect(session, spec, ids=[0, 1, 3, 4])
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)
    words = coordinator.combine(_shares(session, request, [4, 0, 3]))
    assert np.array_equal(words, session.expected([0, 1, 3, 4]))
    assert coordinator.liars == {}


def _shift(session, response: bytes, spec, delta: int) -> bytes:
    """The issue's lie: multiply each decryption share by (1 + x n), moving the plaintext."""
    message = tm.decode(response, tm.VerifiedShares)
    pk = session.public_key
    values = decode_batch(message.batch, pk, round_index=spec.sequence,
                          count=spec.ciphertexts(pk))
    shifted = [v * (1 + delta * pk.n) % pk.n_square for v in values]
    return tm.encode(tm.VerifiedShares(message.sequence, message.party,
                                       encode_batch(pk, spec.sequence, shifted), message.proof))


def test_a_shifted_share_is_detected_the_liar_named_and_honest_shares_still_decrypt(session):
    spec = session.spec()
    server = _collect(session, spec)
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)
    responses = _shares(session, request, [0, 1, 2, 3])
    responses[1] = _shift(session, responses[1], spec, 1000)
    words = coordinator.combine(responses)
    assert coordinator.liars == {1: BAD_PROOF}
    assert np.array_equal(words, session.expected(range(5)))
    with pytest.raises(ProtocolAbort, match=r"refused parties: \[1\]"):
        session.coordinator(server).combine({c: responses[c] for c in (0, 1, 2)})


def test_a_corrupt_client_cannot_submit_a_function_of_a_victims_ciphertext(session):
    """Break 2: c_v^-1 Enc(count) under the corrupt client's own valid key is refused, whether it
    carries no proof, a proof for its own honest batch, or the victim's proof."""
    spec = session.spec(length=10)
    subs = session.submissions(spec, [0, 1, 2])
    victim, corrupt, pk = decode(subs[0], Submission), 4, session.public_key
    count = spec.ciphertexts(pk)
    own = decode(session.clients[corrupt].submit(spec.to_bytes(), np.zeros(spec.length - 1,
                                                                           dtype=np.uint64)),
                 Submission)
    c_v = decode_batch(victim.batch, pk, round_index=spec.sequence, count=count)
    c_own = decode_batch(own.batch, pk, round_index=spec.sequence, count=count)
    forged = encode_batch(pk, spec.sequence, [pow(int(v), -1, int(pk.n_square)) * int(o)
                                              % pk.n_square for v, o in zip(c_v, c_own)])
    identity = session.identities[corrupt]
    for helper, proof in enumerate((b"", own.proof, victim.proof, bytes(len(own.proof)))):
        unsigned = Submission(corrupt, spec.digest, forged, proof=proof)
        data = encode(Submission(corrupt, spec.digest, forged,
                                 identity.sign(SUBMIT_DOMAIN + unsigned.signed_part()), proof))
        server = session.server(spec)
        with pytest.raises(MalformedMessage):
            server.receive(corrupt, data)
        # the honest parties refuse it too, even when the server sums it and a quorum endorses
        request = _forced_request(session, spec, [subs[0], subs[1], data])
        with pytest.raises(ClientAbort, match=party_rules.UNAUTHENTICATED):
            session.clients[helper].decryption_share(request)


def _forced_request(session, spec, submissions, endorsers=None, sequence=None):
    """A lying server's request: any submissions, endorsed by corrupt-signed endorsements of all
    parties (it holds every party's identity here, the strongest possible forger)."""
    entries = tuple(sorted((decode(raw, Submission).client_id, hashlib.sha256(raw).digest())
                           for raw in submissions))
    listing = tm.ContributorList(spec.to_bytes(), entries)
    digest = listing.digest(session.public_key.key_id)
    sequence = spec.sequence if sequence is None else sequence
    signed = []
    for party in endorsers if endorsers is not None else session.clients:
        body = tm.Endorsement(party, sequence, digest).signed_part()
        signed.append((party, session.identities[party].sign(tm.ENDORSE_DOMAIN + body)))
    return tm.encode(tm.CertifiedRequest(spec.to_bytes(), tuple(submissions), tuple(signed)))


@pytest.mark.parametrize("groups", [((0, 1, 2), (2, 3)), ((0, 1), (2, 3))])
def test_two_subsets_of_one_aggregation_never_both_decrypt(groups):
    """Break 3: the server asks disjoint or overlapping groups to endorse and decrypt two different
    subsets of one aggregation; with N = 5, t = 2 (so c = 1, q = 4) and party 4 corrupt
    (endorsing and decrypting both), at most one list is certified and decrypted."""
    session = make_paillier_session(5, threshold=2, custody="threshold", key_bits=512)
    spec = session.spec(length=8)
    subs = session.submissions(spec)
    lists = [(0, 1, 2), (0, 1, 3)]
    servers = []
    for ids in lists:
        server = session.server(spec)
        for c in ids:
            server.receive(c, subs[c])
        servers.append(session.coordinator(server))
    certified = servers
    # each group first, then every party asked for both lists: whoever endorsed one list
    # refuses the other, so the two lists' endorsements never both reach q = 4
    for order in ([list(g) for g in groups], [list(range(4))] * 2):
        for coordinator, group in zip(certified, order):
            for party in group:
                try:
                    coordinator.add_endorsement(party, session.clients[party].endorse(
                        coordinator.contributor_list()))
                except ClientAbort as abort:
                    assert abort.reason == party_rules.CONFLICT
    for coordinator in certified:
        body = tm.Endorsement(4, spec.sequence, coordinator.digest).signed_part()
        coordinator.add_endorsement(4, tm.encode(tm.Endorsement(
            4, spec.sequence, coordinator.digest, session.identities[4].sign(tm.ENDORSE_DOMAIN + body))))
    assert sum(len(c.endorsements) >= c.quorum for c in certified) <= 1
    decrypted = 0
    for coordinator in certified:
        try:
            request = coordinator.request()
        except ProtocolAbort:
            continue
        responses = {}
        for party in range(5):
            try:
                responses[party] = session.clients[party].decryption_share(request)
            except ClientAbort:
                pass
        coordinator.combine(responses)
        decrypted += 1
    assert decrypted == (1 if groups[0] == (0, 1, 2) else 0)


def test_parties_refuse_what_they_cannot_check(session):
    spec = session.spec()
    subs = session.submissions(spec)
    raw = list(subs.values())
    first = decode(raw[0], Submission)
    tampered = encode(Submission(first.client_id, first.spec_digest,
                                 first.batch[:-1] + bytes([first.batch[-1] ^ 1]), first.signature,
                                 first.proof))
    cases = [
        (party_rules.TOO_FEW, raw[:2], None),
        (party_rules.UNAUTHENTICATED, [tampered, *raw[1:]], None),
        (party_rules.UNAUTHENTICATED, [raw[0], raw[0], raw[1]], None),  # one client counted twice
        (party_rules.NO_QUORUM, raw, [0, 1, 2]),  # q = 4 of 5
    ]
    for party, (reason, submissions, endorsers) in enumerate(cases, start=1):
        with pytest.raises(ClientAbort, match=reason):
            session.clients[party].decryption_share(_forced_request(session, spec, submissions,
                                                                    endorsers))
    with pytest.raises(ClientAbort, match=party_rules.NO_QUORUM):  # endorsements of another sequence
        session.clients[0].decryption_share(_forced_request(session, spec, raw,
                                                            sequence=spec.sequence + 1))
    tagged = RoundSpec(spec.sequence + 10, spec.length, spec.slot_bits, spec.word_bound,
                       spec.max_contributions, tagged=True)
    request = tm.decode(_forced_request(session, spec, raw), tm.CertifiedRequest)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        session.clients[4].decryption_share(tm.encode(tm.CertifiedRequest(
            tagged.to_bytes(), request.submissions, request.endorsements)))


def test_a_contributor_outside_the_parties_roster_is_never_endorsed_or_decrypted(session):
    """Review S5-1, checked for threshold custody: a party endorses and decrypts only lists of its
    dealt roster's ids, each submission signed by that id's roster identity key, so a site outside
    the roster (its own valid key, under its own id or a roster id) is refused, even with every
    party's endorsement forged."""
    spec = session.spec()
    raw = list(session.submissions(spec, [0, 1]).values())
    first = decode(raw[0], Submission)
    outsider = SigningKey.generate()

    def signed_by_outsider(client_id: int) -> bytes:
        unsigned = Submission(client_id, first.spec_digest, first.batch, proof=first.proof)
        return encode(Submission(client_id, first.spec_digest, first.batch,
                                 outsider.sign(SUBMIT_DOMAIN + unsigned.signed_part()), first.proof))

    listed = [*raw, signed_by_outsider(9)]
    listing = tm.ContributorList(spec.to_bytes(), tuple(sorted(
        (decode(r, Submission).client_id, hashlib.sha256(r).digest()) for r in listed)))
    with pytest.raises(ClientAbort, match=party_rules.BAD_LIST):
        session.clients[0].endorse(tm.encode(listing))
    for client_id in (9, 2):  # its own id, or the id of a roster site that did not submit
        with pytest.raises(ClientAbort, match=party_rules.UNAUTHENTICATED):
            session.clients[3].decryption_share(_forced_request(session, spec,
                                                                [*raw, signed_by_outsider(client_id)]))


def test_a_forged_verification_key_message_is_refused(session):
    keys = tm.decode(session.keys, tm.VerificationKeys)
    forged = tm.encode(tm.VerificationKeys(keys.key_id, keys.threshold, keys.parties, keys.keys[0],
                                           keys.keys, keys.signature))
    with pytest.raises(ClientAbort, match=client_rules.BAD_KEYS):
        session.clients[0].receive_verification_keys(forged)


def test_dealer_hands_each_share_out_once():
    dealer = ThresholdDealer(parties=[10, 20, 30], threshold=2, key_bits=512, allow_insecure=True)
    assert dealer.hand_out(20).index == 2
    with pytest.raises(InvalidArgumentError):
        dealer.hand_out(20)
    with pytest.raises(InvalidArgumentError):
        ThresholdDealer(parties=[1, 1], threshold=2, key_bits=512, allow_insecure=True)
