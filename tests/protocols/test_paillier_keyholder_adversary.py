"""Key-holder custody against a lying server (and lying clients), played against the unmodified
honest parties: the plaintext-oracle attack of issue 11, a server that SEARCHES random
combinations of ciphertexts, chosen encryptions, subsets and sequence numbers, carries caused by a
client, replayed key announcements and forged welcomes."""

from __future__ import annotations

from dataclasses import replace

import gmpy2
import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.paillier import PaillierClient, PaillierKeyHolder
from fedsec.protocols.paillier import client as client_rules
from fedsec.protocols.paillier.keyholder import REFUSAL
from fedsec.protocols.paillier.messages import (
    REQUEST_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Submission,
    Welcome,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import client_tags
from fedsec.protocols.paillier.state import MemorySequenceStore, StaleSequence
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import DJNRandomness, decode_batch, encode_batch, encrypt
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.protocols.paillier_helpers import WORD_BOUND, make_paillier_session


def _sign(session, spec, participants, values) -> bytes:
    unsigned = DecryptionRequest(spec.to_bytes(), tuple(participants),
                                 encode_batch(session.public_key, spec.sequence, values),
                                 roster=session.names)
    signature = session.server_identity.sign(REQUEST_DOMAIN + unsigned.signed_part())
    return encode(replace(unsigned, signature=signature))


def _ciphertexts(session, spec, data: bytes) -> list:
    return decode_batch(decode(data, Submission).batch, session.public_key,
                        round_index=spec.sequence, count=spec.ciphertexts(session.public_key))


def _world(victim_words: np.ndarray):
    """One key holder, three clients; client 0 (the victim) submits ``victim_words``."""
    session = make_paillier_session(3, threshold=2, key_bits=512)
    spec = session.spec(length=30)
    submissions = session.submissions(spec, [1, 2], seed=1)
    submissions[0] = session.clients[0].submit(spec.to_bytes(), victim_words, roster=session.names)
    return session, spec, {c: _ciphertexts(session, spec, d) for c, d in submissions.items()}


def test_the_plaintext_oracle_of_issue_11_sees_the_same_bytes_whatever_the_victim_holds():
    """Break 1 replayed: the server multiplies the victim's ciphertext by encryptions of values it
    chooses and sends them under old, current and future sequence numbers, binary-searching on
    the answer. In two worlds whose victims hold different plaintexts the server's whole view
    (every response byte) is identical, and the real round then fails visibly."""
    low = np.zeros(30, dtype=np.uint64)
    high = np.full(30, WORD_BOUND, dtype=np.uint64)
    transcripts = []
    for victim in (low, high):
        session, spec, cts = _world(victim)
        public = session.public_key
        chosen = DJNRandomness(public)
        transcript = []
        lo, hi = 0, 1 << public.plaintext_bits
        for probe in range(24):
            x = (lo + hi) // 2
            offset = encrypt(public, [x % public.n, 0], chosen)
            forged = [c * e % public.n_square for c, e in zip(cts[0], offset, strict=True)]
            sequence = (0, spec.sequence, spec.sequence + 1 + probe, 2**64 - 1)[probe % 4]
            for claimed in ([0, 1], [0, 1, 2], [0]):
                answer = session.key_holder.respond(
                    _sign(session, replace(spec, sequence=sequence), claimed, forged))
                transcript.append(answer)
            if answer == REFUSAL:  # the search would branch on the answer: it never can
                hi = x
            else:
                lo = x
        honest = [a * b % public.n_square for a, b in zip(cts[0], cts[1], strict=True)]
        transcript.append(session.key_holder.respond(_sign(session, spec, [0, 1], honest)))
        transcripts.append(transcript)
        assert session.key_holder.decryptions == 0
    assert transcripts[0] == transcripts[1]
    assert set(transcripts[0]) == {REFUSAL}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_searching_server_learns_only_honest_sums_of_at_least_t(data):
    """The server forms random affine combinations of the honest ciphertexts (exponents in
    {-1, 0, 1, 2} per client and index, a random index permutation, encryptions of chosen
    offsets in the data slots or the tag field), claims a random contributor list and a random
    sequence number, over several requests a round. Every answer is the one fixed refusal, or the
    exact sum of the claimed clients' own ciphertexts each taken once (and then |S| >= t)."""
    session = make_paillier_session(3, threshold=2, key_bits=512)
    holder, public = session.key_holder, session.public_key
    n2 = public.n_square
    chosen = DJNRandomness(public)
    for _ in range(2):
        spec = session.spec(length=30)
        layout = spec.layout(public)
        count = spec.ciphertexts(public)
        cts = {c: _ciphertexts(session, spec, d) for c, d in session.submissions(spec).items()}
        for _ in range(data.draw(st.integers(1, 4), label="requests")):
            honest = data.draw(st.booleans(), label="honest form")
            claimed = data.draw(st.lists(st.sampled_from([0, 1, 2, 7]), max_size=4), label="S")
            if honest:
                claimed = sorted(set(claimed) - {7})
                exponents = {c: [int(c in claimed)] * count for c in cts}
                order, offsets = list(range(count)), [0] * count
            else:
                exponents = {c: data.draw(st.lists(st.sampled_from([-1, 0, 1, 2]), min_size=count,
                                                   max_size=count), label=f"e{c}") for c in cts}
                order = data.draw(st.permutations(range(count)), label="order")
                where = data.draw(st.sampled_from(["none", "data", "tag"]), label="offset")
                shift = 0 if where != "tag" else layout.data_bits
                offsets = [data.draw(st.integers(0, (1 << 40) - 1), label="delta") << shift
                           if where != "none" else 0 for _ in range(count)]
            sequence = data.draw(st.sampled_from([spec.sequence, spec.sequence - 1,
                                                  spec.sequence + 1, 2**64 - 1]), label="seq")
            product = []
            for k in range(count):
                acc = encrypt(public, [offsets[k]], chosen)[0]
                for c, values in cts.items():
                    e = exponents[c][order[k]]
                    if e:
                        acc = acc * gmpy2.powmod(values[order[k]], e, n2) % n2
                product.append(acc)
            answer = holder.respond(_sign(session, replace(spec, sequence=sequence), claimed,
                                          product))
            if answer == REFUSAL:
                continue
            event("a sum released")
            result = decode(answer, DecryptionResult)
            faithful = (order == list(range(count)) and not any(offsets)
                        and all(exponents[c] == [int(c in claimed)] * count for c in cts))
            assert faithful and len(claimed) >= session.threshold
            assert sequence == spec.sequence and result.participants == tuple(claimed)
            assert np.array_equal(result.words, session.expected(claimed))
        if holder.last_sequence < spec.sequence:  # the round was not burned: the honest request works
            everyone = [gmpy2.mpz(1)] * count
            for values in cts.values():
                everyone = [a * b % n2 for a, b in zip(everyone, values, strict=True)]
            result = decode(holder.respond(_sign(session, spec, sorted(cts), everyone)),
                            DecryptionResult)
            assert np.array_equal(result.words, session.expected(sorted(cts)))
    assert holder.decryptions <= 2


def test_a_carry_caused_by_a_client_is_refused_never_released():
    """A malicious client (it knows the group MAC key and its own pad) fills slot 0 to the top,
    so the sum carries into slot 1 while every word stays in range; its tag is the correct MAC of
    its own slots. The key holder refuses the sum; the same client with in-range words passes."""
    session = make_paillier_session(3, threshold=2, key_bits=512)
    public = session.public_key
    for fill, accepted in (((1 << 18) - 1, False), (WORD_BOUND, True)):
        spec = session.spec(length=30, contributions=3)
        assert spec.slot_bits == 18
        layout = spec.layout(public)
        honest = session.submissions(spec, [1, 2])
        liar = session.clients[0]
        words = np.zeros(spec.length, dtype=np.uint64)
        words[0], words[-1] = fill, 1
        rows = layout.rows(words)
        tags = client_tags(liar._mac_key, liar._tag_key, spec, layout, rows)
        mine = encrypt(public, layout.pack(words, tags), DJNRandomness(public))
        total = list(mine)
        for c in (1, 2):
            for k, value in enumerate(_ciphertexts(session, spec, honest[c])):
                total[k] = total[k] * value % public.n_square
        answer = session.key_holder.respond(_sign(session, spec, [0, 1, 2], total))
        if accepted:
            expected = session.expected([1, 2])
            expected[0] += np.uint64(fill)
            expected[-1] += np.uint64(1)
            assert np.array_equal(decode(answer, DecryptionResult).words, expected)
        else:
            assert int(session.words[1][0] + session.words[2][0]) >= 1  # so slot 0 carried
            assert answer == REFUSAL and "tags" in session.key_holder.refusals[-1][1]


def test_a_replayed_announcement_never_moves_a_client_back():
    session = make_paillier_session(2, threshold=2, key_bits=512)
    server_identity = session.server_identity.public
    identity = SigningKey.generate()
    old = PaillierKeyHolder(threshold=2, server_identity=server_identity, identity=identity,
                            key_bits=512, allow_insecure=True, epoch=1)
    new = PaillierKeyHolder(threshold=2, server_identity=server_identity, identity=identity,
                            key_bits=512, allow_insecure=True, epoch=2)
    same_epoch = PaillierKeyHolder(threshold=2, server_identity=server_identity,
                                   identity=identity, key_bits=512, allow_insecure=True, epoch=2)
    client = PaillierClient(5, identity=SigningKey.generate(), announcer_identity=identity.public,
                            min_key_bits=512)
    first = client.receive_announcement(old.announcement())
    assert client.receive_announcement(old.announcement()) == first  # the same one again: no-op
    client.receive_announcement(new.announcement())
    assert client.public_key == new.public_key and client.epoch == 2
    for replayed in (old.announcement(), same_epoch.announcement()):
        with pytest.raises(ClientAbort, match="older key epoch"):
            client.receive_announcement(replayed)
        assert client.public_key == new.public_key and client.epoch == 2


def test_a_welcome_the_server_forged_or_moved_is_refused():
    session = make_paillier_session(2, threshold=2, key_bits=512)
    holder = session.key_holder
    client = PaillierClient(0, identity=session.identities[0],
                            announcer_identity=holder.identity.public, min_key_bits=512)
    registration = client.receive_announcement(holder.announcement())
    welcome = decode(holder.register(registration), Welcome)
    spec = session.spec(length=10)
    with pytest.raises(ClientAbort, match=client_rules.NOT_READY):
        client.submit(spec.to_bytes(), np.zeros(spec.length - 1, dtype=np.uint64), roster=session.names)
    forged = [replace(welcome, sealed=welcome.sealed[:-1] + bytes([welcome.sealed[-1] ^ 1])),
              replace(welcome, client_id=1), replace(welcome, epoch=2), b"junk"]
    for message in forged:
        with pytest.raises(ClientAbort):
            client.receive_welcome(message if isinstance(message, bytes) else encode(message))
    client.receive_welcome(encode(welcome))
    client.submit(spec.to_bytes(), np.zeros(spec.length - 1, dtype=np.uint64), roster=session.names)


def test_memory_store_accepts_only_the_next_number():
    store = MemorySequenceStore()
    for bad in (0, 2, 2**63):
        with pytest.raises(StaleSequence):
            store.burn(b"k", bad)
    store.burn(b"k", 1)
    store.burn(b"other", 1)
    with pytest.raises(StaleSequence):
        store.burn(b"k", 1)
    assert store.last_burned(b"k") == 1 and store.last_burned(b"none") == 0


def test_new_messages_round_trip_and_refuse_truncation():
    from fedsec.protocols.errors import MalformedMessage
    from fedsec.protocols.paillier.messages import Announcement, Refusal

    messages = [Welcome(3, bytes(range(16)), 2**64 - 1, b"sealed"), Refusal(),
                Announcement(1, b"pk", bytes(32), 2, bytes(64), 7),
                DecryptionRequest(b"spec", (1, 2), b"batch", bytes(range(64))),
                DecryptionRequest(b"spec", (), b"", bytes(64), ("hosp-a", "hosp-\u00e9"))]
    for message in messages:
        data = encode(message)
        assert decode(data, type(message)) == message
        with pytest.raises(MalformedMessage):
            decode(data[:-1] if len(data) > 6 else data + b"\x00", type(message))
    assert encode(Refusal()) == REFUSAL and len(REFUSAL) == 6


def test_a_burn_that_loses_a_race_is_refused_like_any_other():
    class Raced(MemorySequenceStore):
        def burn(self, key_id: bytes, sequence: int) -> None:
            super().burn(key_id, sequence)
            super().burn(key_id, sequence)  # another process burned it first

    session = make_paillier_session(3, threshold=2, key_bits=512)
    session.key_holder.store = Raced()
    spec = session.spec(length=10)
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    assert session.key_holder.respond(server.decryption_request()) == REFUSAL
    assert session.key_holder.refusals[-1] == (1, "burned concurrently")
