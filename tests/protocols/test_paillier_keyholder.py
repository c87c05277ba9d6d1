"""Key-holder custody: honest sums, and every way a server can ask for more is refused."""

from __future__ import annotations

import re
from dataclasses import replace

import gmpy2
import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import DecryptionRefused, RoundSpec
from fedsec.protocols.paillier import client as client_rules
from fedsec.protocols.paillier.keyholder import REFUSAL
from fedsec.protocols.paillier.messages import (
    REQUEST_DOMAIN,
    SUBMIT_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Submission,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import NO_ROSTER, roster_digest
from fedsec.secagg.paillier import DJNRandomness, decode_batch, encode_batch, encrypt, generate_keypair
from fedsec.secagg.paillier.packing import MAC_PRIME

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


def _request(session, spec, participants, values, *, signer=None, batch_round=None, names=None):
    """A decryption request as the (lying) server builds it, signed with its identity."""
    public = session.public_key
    batch = encode_batch(public, spec.sequence if batch_round is None else batch_round, values)
    unsigned = DecryptionRequest(spec.to_bytes(), tuple(participants), batch,
                                 roster=session.names if names is None else tuple(names))
    signature = (signer or session.server_identity).sign(REQUEST_DOMAIN + unsigned.signed_part())
    return encode(replace(unsigned, signature=signature))


TAGS = "tags"
LIES = {"claims a dropped client": TAGS, "one client claimed as many": TAGS,
        "scaled ciphertext": TAGS, "swapped positions": TAGS,
        "listed twice": "listed twice", "too few": "contributors, need",
        "unregistered": "not registered", "other spec": TAGS,
        "stale ciphertexts": TAGS, "batch for another round": "invalid ciphertext batch",
        "untagged": "no integrity tags", "plaintext added": TAGS,
        "data offset": TAGS, "offset that carries": TAGS, "offset in a padding slot": TAGS,
        "tag field plus p": "tags", "signed by a client": "not signed by the server",
        "unsigned": "not signed by the server", "sequence 2^64 - 1": "not the next",
        "old sequence": "not the next", "another roster's digest": TAGS,
        "names off the digest": "do not hash", "names reordered": "canonical",
        "a name twice": "malformed", "no roster": "bound to no roster",
        "a roster without a contributor": "outside the spec's roster"}


@pytest.mark.parametrize("lie", list(LIES))
def test_key_holder_refuses_every_aggregate_it_cannot_authenticate(session, lie):
    """Each lie of a server (holding the public key and every ciphertext) against the unmodified
    key holder: refused with the one fixed refusal, the reason only in the key holder's record."""
    holder, public = session.key_holder, session.public_key
    n2 = public.n_square
    spec = session.spec(length=300)
    layout = spec.layout(public)
    if lie == "claims a dropped client":
        server = _collect(session, spec, ids=[0, 1, 2])
        data = _request(session, spec, [0, 1, 2, 3], server._total)
    elif lie == "one client claimed as many":
        one = decode_batch(decode(session.submissions(spec, [0])[0], Submission).batch, public,
                           round_index=spec.sequence, count=spec.ciphertexts(public))
        data = _request(session, spec, [0, 1, 2], one)
    elif lie == "too few":
        server = _collect(session, spec, ids=[0, 1])
        data = _request(session, spec, [0, 1], server._total)
    elif lie == "plaintext added":  # a known plaintext in the top field fakes a fourth client
        server = _collect(session, spec, ids=[0, 1, 2])
        fake = (1 + (1 << layout.data_bits) * public.n) % n2
        data = _request(session, spec, [0, 1, 2, 3], [t * fake % n2 for t in server._total])
    elif lie == "old sequence":
        server = _collect(session, spec)
        holder.decrypt(server.decryption_request())
        data = _request(session, spec, server.participants, server._total)
    else:
        server = _collect(session, spec)
        total, ids = list(server._total), list(server.participants)

        def shifted(offset, index=0):
            plus = (1 + offset * public.n) % n2
            return [c * plus % n2 if k == index else c for k, c in enumerate(total)]

        if lie == "scaled ciphertext":
            data = _request(session, spec, ids, [gmpy2.powmod(total[0], 2, n2), *total[1:]])
        elif lie == "swapped positions":
            data = _request(session, spec, ids, [total[1], total[0], *total[2:]])
        elif lie == "listed twice":
            data = _request(session, spec, [0, 1, 2, 2], total)
        elif lie == "unregistered":
            data = _request(session, spec, [0, 1, 2, 3, 9], total)
        elif lie == "other spec":
            other = RoundSpec(spec.sequence, spec.length, spec.slot_bits + 1, spec.word_bound * 2,
                              spec.max_contributions, roster=spec.roster)
            data = _request(session, other, ids, total)
        elif lie == "stale ciphertexts":
            holder.decrypt(server.decryption_request())
            data = _request(session, session.spec(length=300), ids, total)
        elif lie == "batch for another round":
            data = _request(session, spec, ids, total, batch_round=spec.sequence + 1)
        elif lie == "another roster's digest":  # the clients' tags bind their own roster's digest
            wider = (*session.names, "outsider")
            data = _request(session, replace(spec, roster=roster_digest(wider)), ids, total, names=wider)
        elif lie == "names off the digest":
            data = _request(session, spec, ids, total, names=(*session.names, "outsider"))
        elif lie == "names reordered":
            data = _request(session, spec, ids, total, names=session.names[::-1])
        elif lie == "a name twice":
            data = _request(session, spec, ids, total, names=(session.names[0], *session.names))
        elif lie == "no roster":
            data = _request(session, replace(spec, roster=NO_ROSTER), ids, total)
        elif lie == "a roster without a contributor":  # its digest and names agree; client 3 is not in it
            narrow = session.names[:3]
            data = _request(session, replace(spec, roster=roster_digest(narrow)), ids, total, names=narrow)
        elif lie == "untagged":
            untagged = RoundSpec(spec.sequence, spec.length, spec.slot_bits, spec.word_bound,
                                 spec.max_contributions, tagged=False)
            data = _request(session, untagged, ids, total)
        elif lie == "data offset":  # +1 in slot 0: biases a word, every range still holds
            data = _request(session, spec, ids, shifted(1))
        elif lie == "offset that carries":  # a carry out of slot 0 into slot 1
            data = _request(session, spec, ids, shifted((1 << spec.slot_bits) - 1))
        elif lie == "offset in a padding slot":
            data = _request(session, spec, ids,
                            shifted(1 << (layout.data_bits - spec.slot_bits), len(total) - 1))
        elif lie == "tag field plus p":
            data = _request(session, spec, ids, shifted(MAC_PRIME * 4 << layout.data_bits))
        elif lie == "signed by a client":
            data = _request(session, spec, ids, total, signer=session.identities[0])
        elif lie == "unsigned":
            data = encode(replace(decode(server.decryption_request(), DecryptionRequest),
                                  signature=bytes(64)))
        else:  # junk with the largest sequence number must not brick the key holder
            far = replace(spec, sequence=2**64 - 1)
            data = _request(session, far, ids, total)
    before, burned = holder.decryptions, holder.last_sequence
    assert holder.respond(data) == REFUSAL
    assert re.search(LIES[lie], holder.refusals[-1][1]), holder.refusals[-1]
    assert holder.decryptions == before
    with pytest.raises(DecryptionRefused) as refused:
        holder.decrypt(data)
    assert str(refused.value) == "the key holder refused to decrypt"
    if LIES[lie] in ("not signed by the server", "not the next"):
        assert holder.last_sequence == burned  # nothing changed


def test_each_aggregation_is_decrypted_at_most_once(session):
    spec = session.spec()
    server = _collect(session, spec)
    request = server.decryption_request()
    session.key_holder.decrypt(request)
    with pytest.raises(DecryptionRefused):
        session.key_holder.decrypt(request)
    # a subset of the same aggregation is refused too: no differencing
    with pytest.raises(DecryptionRefused):
        session.key_holder.decrypt(_request(session, spec, [0, 1, 2], server._total))
    assert [reason for _, reason in session.key_holder.refusals] == [
        "not the next sequence number (2)"] * 2


def test_junk_burns_nothing_and_a_probe_burns_the_real_round_visibly(session):
    holder = session.key_holder
    spec = session.spec()
    server = _collect(session, spec)
    total = list(server._total)
    for sequence in (0, 2, 3, 2**63, 2**64 - 1):
        assert holder.respond(_request(session, replace(spec, sequence=sequence), [0, 1, 2, 3],
                                       total)) == REFUSAL
    assert holder.respond(_request(session, spec, [0, 1, 2, 3], total,
                                   signer=session.identities[1])) == REFUSAL
    assert holder.last_sequence == 0 and holder.decryptions == 0
    # the server probes with the victim's ciphertext under the real round's number: it burns it
    probe = [total[0] * (1 + 5 * session.public_key.n) % session.public_key.n_square, *total[1:]]
    assert holder.respond(_request(session, spec, [0, 1, 2, 3], probe)) == REFUSAL
    assert holder.last_sequence == spec.sequence
    with pytest.raises(DecryptionRefused):
        holder.decrypt(server.decryption_request())
    assert holder.decryptions == 0 and len(holder.refusals) == 8
    # the next round works again
    spec = session.spec()
    server = _collect(session, spec)
    words = server.finish(holder.decrypt(server.decryption_request()))
    assert np.array_equal(words, session.expected(range(4)))


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
    client.submit(spec.to_bytes(), words, roster=session.names)
    with pytest.raises(ClientAbort, match=client_rules.REPLAY):
        client.submit(spec.to_bytes(), words, roster=session.names)
    spec = session.spec()
    with pytest.raises(ClientAbort, match=client_rules.BAD_WORDS):
        client.submit(spec.to_bytes(), words + np.uint64(spec.word_bound + 1), roster=session.names)
    with pytest.raises(ClientAbort, match=client_rules.BAD_WORDS):
        client.submit(spec.to_bytes(), words[:-1], roster=session.names)
    untagged = RoundSpec(spec.sequence, spec.length, spec.slot_bits, spec.word_bound,
                         spec.max_contributions, tagged=False)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        client.submit(untagged.to_bytes(), words, roster=session.names)
    with pytest.raises(ClientAbort, match=client_rules.BAD_SPEC):
        client.submit(b"\x00" * 5, words, roster=session.names)
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


def test_an_aborted_aggregation_burns_its_number_so_the_next_one_decrypts(session):
    holder = session.key_holder
    spec = session.spec()
    server = _collect(session, spec, ids=[0, 1])  # below the threshold of 3
    with pytest.raises(ProtocolAbort):
        server.decryption_request()
    assert holder.respond(server.void_request()) == REFUSAL
    assert holder.last_sequence == spec.sequence and holder.decryptions == 0
    spec = session.spec()
    server = _collect(session, spec)
    words = server.finish(holder.decrypt(server.decryption_request()))
    assert np.array_equal(words, session.expected(range(4)))
