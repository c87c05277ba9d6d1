"""Key-holder custody: honest sums, and every way a server can ask for more is refused."""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest

from protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from protocols.paillier import DecryptionRefused, RoundSpec
from protocols.paillier import client as client_rules
from protocols.paillier.messages import (
    SUBMIT_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Submission,
    decode,
    encode,
)
from secagg.paillier import DJNRandomness, decode_batch, encode_batch, encrypt, generate_keypair
from tests.protocols.paillier_helpers import make_paillier_session


@pytest.fixture
def session():
    return make_paillier_session(4, threshold=3)


def _collect(session, spec, ids=None):
    server = session.server(spec)
    for c, data in session.submissions(spec, ids).items():
        server.receive(c, data)
    return server


def test_honest_round_releases_the_exact_sum(session):
    spec = session.spec(length=300)  # several ciphertexts
    assert spec.ciphertexts(session.public_key) > 3
    server = _collect(session, spec)
    words = server.finish(session.key_holder.decrypt(server.decryption_request()))
    assert np.array_equal(words, session.expected(range(4)))


def test_a_client_that_never_sends_is_simply_not_in_the_sum(session):
    spec = session.spec()
    server = _collect(session, spec, ids=[0, 2, 3])
    words = server.finish(session.key_holder.decrypt(server.decryption_request()))
    assert np.array_equal(words, session.expected([0, 2, 3]))
    spec = session.spec()
    server = _collect(session, spec, ids=[1, 2])
    with pytest.raises(ProtocolAbort):
        server.decryption_request()


def _resign(session, client_id, message):
    unsigned = Submission(message.client_id, message.spec_digest, message.batch)
    signature = session.identities[client_id].sign(SUBMIT_DOMAIN + unsigned.signed_part())
    return encode(Submission(unsigned.client_id, unsigned.spec_digest, unsigned.batch, signature))


def test_malformed_submissions_are_refused_and_change_nothing(session):
    spec = session.spec()
    server = session.server(spec)
    honest = session.submissions(spec)
    server.receive(0, honest[0])
    before = list(server._total)
    public = session.public_key
    message = decode(honest[1], Submission)
    values = decode_batch(message.batch, public, round_index=spec.sequence, count=server.count)
    other, _ = generate_keypair(1024, allow_insecure=True)
    n, n2, width = public.n, int(public.n_square), public.ciphertext_bytes

    def with_batch(batch):
        return _resign(session, 1, Submission(1, spec.digest, batch))

    bad = {
        "zero": with_batch(encode_batch(public, spec.sequence, [0, *values[1:]])),
        "n": with_batch(encode_batch(public, spec.sequence, [n, *values[1:]])),
        "n^2": with_batch(encode_batch(public, spec.sequence, [n2, *values[1:]])),
        "n^2+7": with_batch(encode_batch(public, spec.sequence, values)[:-width]
                            + (n2 + 7).to_bytes(width, "big")),
        "other key": with_batch(encode_batch(other, spec.sequence,
                                             encrypt(other, [1] * len(values), DJNRandomness(other)))),
        "other round": with_batch(encode_batch(public, spec.sequence + 1, values)),
        "wrong count": with_batch(encode_batch(public, spec.sequence, values + values[:1])),
        "garbage batch": with_batch(b"\x00" * 100),
        "garbage message": b"garbage",
        "other spec": _resign(session, 1, Submission(1, b"\x00" * 32, message.batch)),
        "bad signature": encode(Submission(1, spec.digest, message.batch, b"\x01" * 64)),
        "other client's id": honest[2],
        "repeat": honest[0],
    }
    for name, data in bad.items():
        sender = 0 if name == "repeat" else 1
        with pytest.raises(MalformedMessage):
            server.receive(sender, data)
            pytest.fail(name)
        assert server.participants == [0] and server._total == before, name
    for c in (1, 2, 3):
        server.receive(c, honest[c])
    words = server.finish(session.key_holder.decrypt(server.decryption_request()))
    assert np.array_equal(words, session.expected(range(4)))


def _request(spec, participants, values, public):
    return encode(DecryptionRequest(spec.to_bytes(), tuple(participants),
                                    encode_batch(public, spec.sequence, values)))


TAGS = "integrity tags"
LIES = {"claims a dropped client": TAGS, "one client claimed as many": TAGS,
        "scaled ciphertext": f"{TAGS}|invalid aggregate", "swapped positions": TAGS,
        "listed twice": "listed twice", "too few": "contributors, need",
        "unregistered": "not registered", "other spec": TAGS,
        "stale ciphertexts": TAGS, "batch for another round": "invalid aggregate",
        "untagged": "no integrity tags",
        "plaintext added": TAGS}


@pytest.mark.parametrize("lie", list(LIES))
def test_key_holder_refuses_every_aggregate_it_cannot_authenticate(session, lie):
    holder = session.key_holder
    spec = session.spec(length=300)
    server = _collect(session, spec)
    public = session.public_key
    total, ids = list(server._total), list(server.participants)
    n2 = public.n_square
    if lie == "claims a dropped client":
        server = _collect(session, spec := session.spec(length=300), ids=[0, 1, 2])
        data = _request(spec, [0, 1, 2, 3], list(server._total), public)
    elif lie == "one client claimed as many":
        one = decode_batch(decode(session.submissions(spec := session.spec(length=300), [0])[0],
                                  Submission).batch, public, round_index=spec.sequence,
                           count=server.count)
        data = _request(spec, [0, 1, 2], one, public)
    elif lie == "scaled ciphertext":
        data = _request(spec, ids, [gmpy2.powmod(total[0], 2, n2), *total[1:]], public)
    elif lie == "swapped positions":
        data = _request(spec, ids, [total[1], total[0], *total[2:]], public)
    elif lie == "listed twice":
        data = _request(spec, [0, 1, 2, 2], total, public)
    elif lie == "too few":
        server = _collect(session, spec := session.spec(length=300), ids=[0, 1])
        data = _request(spec, [0, 1], list(server._total), public)
    elif lie == "unregistered":
        data = _request(spec, [0, 1, 2, 3, 9], total, public)
    elif lie == "other spec":
        other = RoundSpec(spec.sequence, spec.length, spec.slot_bits + 1, spec.word_bound * 2,
                          spec.max_contributions)
        data = _request(other, ids, total, public)
    elif lie == "stale ciphertexts":
        newer = session.spec(length=300)
        data = _request(newer, ids, total, public)
    elif lie == "batch for another round":
        data = encode(DecryptionRequest(spec.to_bytes(), tuple(ids),
                                        encode_batch(public, spec.sequence + 1, total)))
    elif lie == "untagged":
        untagged = RoundSpec(spec.sequence, spec.length, spec.slot_bits, spec.word_bound,
                             spec.max_contributions, tagged=False)
        data = _request(untagged, ids, total, public)
    else:  # the server adds a known plaintext to the top field to fake a fourth contribution
        shift = spec.layout(public).data_bits
        fake = (1 + (1 << shift) * public.n) % n2
        server = _collect(session, spec := session.spec(length=300), ids=[0, 1, 2])
        data = _request(spec, [0, 1, 2, 3], [t * fake % n2 for t in server._total], public)
    before = holder.decryptions
    with pytest.raises(DecryptionRefused, match=LIES[lie]):
        holder.decrypt(data)
    assert holder.decryptions == before


def test_each_aggregation_is_decrypted_at_most_once(session):
    spec = session.spec()
    server = _collect(session, spec)
    request = server.decryption_request()
    session.key_holder.decrypt(request)
    with pytest.raises(DecryptionRefused, match="not newer"):
        session.key_holder.decrypt(request)
    # a subset of the same aggregation is refused too: no differencing
    with pytest.raises(DecryptionRefused, match="not newer"):
        session.key_holder.decrypt(_request(spec, [0, 1, 2], list(server._total), session.public_key))


def test_server_refuses_a_result_for_another_request(session):
    spec = session.spec()
    server = _collect(session, spec)
    result = decode(session.key_holder.decrypt(server.decryption_request()), DecryptionResult)
    forged = encode(DecryptionResult(result.sequence, (0, 1, 2), result.words))
    with pytest.raises(ProtocolAbort):
        server.finish(forged)


def test_client_rules(session):
    client = session.clients[0]
    spec = session.spec()
    words = np.zeros(spec.length - 1, dtype=np.uint64)
    client.submit(spec.to_bytes(), words)
    with pytest.raises(ClientAbort, match=client_rules.REPLAY):
        client.submit(spec.to_bytes(), words)
    spec = session.spec()
    with pytest.raises(ClientAbort, match=client_rules.BAD_WORDS):
        client.submit(spec.to_bytes(), words + np.uint64(spec.word_bound + 1))
    with pytest.raises(ClientAbort, match=client_rules.BAD_WORDS):
        client.submit(spec.to_bytes(), words[:-1])
    untagged = RoundSpec(spec.sequence, spec.length, spec.slot_bits, spec.word_bound,
                         spec.max_contributions, tagged=False)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        client.submit(untagged.to_bytes(), words)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        client.submit(b"\x00" * 5, words)
    holder = session.key_holder
    announcement = holder.announcement()
    tampered = announcement[:-70] + bytes([announcement[-70] ^ 1]) + announcement[-69:]
    with pytest.raises(ClientAbort, match=client_rules.BAD_ANNOUNCEMENT):
        client.receive_announcement(tampered)
    strict = type(client)(9, identity=session.identities[0],
                          announcer_identity=holder.identity.public, min_key_bits=2048)
    with pytest.raises(ClientAbort, match=client_rules.WEAK_KEY):
        strict.receive_announcement(announcement)
    with pytest.raises(MalformedMessage, match="not enrolled"):
        holder.register(type(client)(9, identity=session.identities[0],
                                     announcer_identity=holder.identity.public,
                                     min_key_bits=1024).receive_announcement(announcement))
