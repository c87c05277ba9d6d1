"""A searching adversary against threshold custody: the server plus one corrupt client-party
(N = 4, t = 2, so c = t - 1 = 1 and q = 3) tries random lists of honest, own and forged submissions
(random products of honest ciphertexts times its own, with no, its own or a victim's proof), random
sequence numbers, endorsers and helpers, against the unmodified honest parties. Whatever it gets
decrypted must be the sum of one list per aggregation, with no forged submission in it."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.messages import SUBMIT_DOMAIN, Submission, decode, encode
from fedsec.secagg.paillier import add_into, decode_batch, encode_batch
from fedsec.secagg.paillier.threshold import combine, decryption_shares

from tests.protocols.paillier_helpers import make_paillier_session

CORRUPT = 3


def _forge(session, spec, rng, honest, own):
    pk, count = session.public_key, spec.ciphertexts(session.public_key)
    total = decode_batch(decode(own, Submission).batch, pk, round_index=spec.sequence, count=count)
    for raw in honest.values():
        exponent = int(rng.integers(-2, 3))
        values = decode_batch(decode(raw, Submission).batch, pk, round_index=spec.sequence,
                              count=count)
        add_into(total, [pow(int(v), exponent, int(pk.n_square)) for v in values], pk)
    batch = encode_batch(pk, spec.sequence, total)
    proofs = [b"", decode(own, Submission).proof] + [decode(r, Submission).proof for r in honest.values()]
    proof = proofs[int(rng.integers(len(proofs)))]
    unsigned = Submission(CORRUPT, spec.digest, batch, proof=proof)
    signature = session.identities[CORRUPT].sign(SUBMIT_DOMAIN + unsigned.signed_part())
    return encode(Submission(CORRUPT, spec.digest, batch, signature, proof))


def test_random_lying_strategies_never_decrypt_more_than_one_honest_list_per_aggregation():
    session = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    rng = np.random.default_rng(11)
    pk = session.public_key
    corrupt_share = session.clients[CORRUPT]._share
    helped: dict[int, set[bytes]] = {}
    decrypted = 0
    for _ in range(16):
        spec = session.spec(length=6)
        honest = session.submissions(spec, [0, 1, 2], seed=int(rng.integers(1 << 30)))
        own_words = rng.integers(0, 50, spec.length - 1, dtype=np.uint64)
        own = session.clients[CORRUPT].submit(spec.to_bytes(), own_words)
        words = {**{c: session.words[c] for c in honest}}
        genuine = {hashlib.sha256(raw).digest() for raw in (*honest.values(), own)}
        for _ in range(3):
            pool = [*honest.values(), own if rng.random() < 0.3 else _forge(session, spec, rng,
                                                                            honest, own)]
            chosen = [pool[i] for i in rng.permutation(len(pool))[: int(rng.integers(2, len(pool) + 1))]]
            sequence = spec.sequence + int(rng.random() < 0.2)
            entries = tuple(sorted((decode(r, Submission).client_id, hashlib.sha256(r).digest())
                                   for r in chosen))
            listing = tm.ContributorList(spec.to_bytes(), entries)
            digest = listing.digest(pk.key_id)
            endorsements = []
            for party in rng.permutation(3)[: int(rng.integers(1, 4))]:
                try:
                    message = tm.decode(session.clients[int(party)].endorse(tm.encode(listing)),
                                        tm.Endorsement)
                    endorsements.append((message.party, message.signature))
                except ClientAbort:
                    pass
            body = tm.Endorsement(CORRUPT, sequence, digest).signed_part()
            endorsements.append((CORRUPT, session.identities[CORRUPT].sign(tm.ENDORSE_DOMAIN + body)))
            request = tm.encode(tm.CertifiedRequest(spec.to_bytes(), tuple(chosen), tuple(endorsements)))
            for party in rng.permutation(3)[: int(rng.integers(1, 4))]:
                try:
                    response = tm.decode(session.clients[int(party)].decryption_share(request),
                                         tm.VerifiedShares)
                except ClientAbort:
                    continue
                helped.setdefault(spec.sequence, set()).add(digest)
                assert {e[1] for e in entries} <= genuine, "a forged submission was decrypted"
                count = spec.ciphertexts(pk)
                product = None
                for raw in chosen:
                    values = decode_batch(decode(raw, Submission).batch, pk,
                                          round_index=spec.sequence, count=count)
                    product = values if product is None else (add_into(product, values, pk) or product)
                shares = {response.party: decode_batch(response.batch, pk, round_index=spec.sequence,
                                                       count=count),
                          CORRUPT + 1: decryption_shares(corrupt_share, product)}
                plain = combine(pk, shares, parties=4, threshold=2)
                unpacked, _ = spec.layout(pk).unpack(plain, spec.length)
                ids = [e[0] for e in entries]
                expected = sum((words[c].astype(object) if c != CORRUPT else own_words.astype(object))
                               for c in ids)
                assert np.array_equal(unpacked[:-1].astype(object), expected)
                assert int(unpacked[-1]) == len(ids) >= session.threshold
                decrypted += 1
    assert all(len(lists) == 1 for lists in helped.values())
    assert decrypted > 0


def test_every_order_of_endorsement_requests_certifies_at_most_one_list():
    """Exhaustive at N = 4, t = 2 (q = 3): for every assignment of the first list each honest
    party is shown (all 4 lists of >= 2 of three submissions), then every party asked for every
    list, and the corrupt party endorsing all, at most one list reaches the quorum."""
    session = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    pk = session.public_key
    certified_any = False
    for first in itertools.product(range(4), repeat=3):
        spec = session.spec(length=4)
        subs = session.submissions(spec, [0, 1, 2])
        lists = [tm.ContributorList(spec.to_bytes(), tuple(sorted(
            (c, hashlib.sha256(subs[c]).digest()) for c in ids)))
            for ids in ((0, 1), (0, 2), (1, 2), (0, 1, 2))]
        endorsers = {k: {CORRUPT} for k in range(4)}
        for party, k in enumerate(first):
            session.clients[party].endorse(tm.encode(lists[k]))
        for party in range(3):
            for k, listing in enumerate(lists):
                try:
                    message = tm.decode(session.clients[party].endorse(tm.encode(listing)),
                                        tm.Endorsement)
                except ClientAbort:
                    continue
                assert message.list_digest == listing.digest(pk.key_id)
                endorsers[k].add(party)
        certified = [k for k, who in endorsers.items() if len(who) >= 3]
        assert len(certified) <= 1
        certified_any |= bool(certified)
    assert certified_any
