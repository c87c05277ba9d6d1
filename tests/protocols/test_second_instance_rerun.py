"""Review rr9: a re-run of one (session, round) with the same clients (the server chooses both).

FINDING (test fails today): "each honest client signs at most one S per round" holds only per
MaskedClient object. The masked protocol keeps no durable record of the survivor list an identity
signed for (session, round, params) (the Paillier parties do: the endorsement store). A lying server
that runs the same (session, round, ring) twice keeps run 1's survivor-list signatures and, in run 2,
gets a quorum on two different lists: one honest holder acts on the full ring (old signatures),
the others on the ring minus d. Honest holders then reveal, in one run, both a share of d's seed
and t shares of d's mask key: step 1 ("one list") and step 2 ("one secret per owner") of the proof
sketch fail. Here the threshold t > (k + c)/2 still keeps both of d's secrets from being rebuilt;
the same root cause, with key entries spliced across concurrent runs, reads an input outright
(test_review_concurrent_runs_read.py).
"""

import dataclasses

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.simulation import build_round
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey

IDS = list(range(1, 8))
IDENTITIES = {c: SigningKey.generate() for c in IDS}
RING = tuple(IDS)


def _run(session=None):
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=len(IDS), max_weight=5, max_length=3)
    built = build_round(updates={c: np.full(3, 0.1 * c, np.float32) for c in IDS},
                        weights=dict.fromkeys(IDS, 1), rngs={c: np.random.default_rng(c) for c in IDS},
                        encoder=encoder, degree=6, threshold=5, round_index=3,
                        identities=IDENTITIES, corrupt=0.2)
    if session is not None:
        built.session = session
    for c in IDS:
        built.clients[c]._ctx.session = built.session
    built.server._round.session = built.session
    built.server._round.graph = RingGraph(RING, 6)
    params = dataclasses.replace(built.server._round.params, ring=RING)
    built.server._round.params, built.server._round.digest = params, m.params_digest(params)
    return built


def _to(built, stage):
    server = built.server
    while server.stage != stage:
        for c, message in server.outgoing().items():
            server.receive(c, built.clients[c].handle(message))
        server.close()


def _attack_a_rerun_of_one_session_and_round_cannot_get_two_survivor_lists_acted_on():
    # Run 1: an honest round; the server keeps every survivor-list signature on the full ring.
    old = _run()
    _to(old, "unmask")
    old_sigs = tuple(sorted(old.server._round.signatures.items()))
    assert len(old_sigs) == len(IDS)

    # Run 2: same session, round, ring, degree, threshold (same parameter digest).
    new = _run(session=old.session)
    _to(new, "consistency check")
    h, d = IDS[0], IDS[1]            # h acts on the full ring; d is the client both lists disagree on
    full, short = RING, tuple(c for c in RING if c != d)
    sigs_short = {}
    header = lambda c: m.Header(0, new.session, 3, m.SERVER, c)  # noqa: E731
    for c in IDS:
        if c == d:
            continue
        survivors = full if c == h else short
        reply = new.clients[c].handle(m.encode(header(c), m.ConsistencyRequest(survivors)))
        sig = m.decode(reply, expect=m.ConsistencySignature)[1].signature
        if c != h:
            sigs_short[c] = sig
    d_seed_shares, d_key_shares = 0, 0
    # h: the old run's signatures on the full ring make its quorum.
    others = tuple(c for c in RING if c != h)
    reply = new.clients[h].handle(m.encode(header(h), m.UnmaskRequest(others, (), old_sigs, ())))
    shares = m.decode(reply, expect=m.UnmaskResponse)[1].shares
    d_seed_shares += sum(1 for o, k, _ in shares if o == d and k == m.SHARE_OF_SEED)
    # Everyone else: the run-2 signatures on the ring without d (5 >= q = 5), d dropped.
    for c in short:
        if c == h:
            continue
        alive = tuple(v for v in short if v != c)
        try:
            reply = new.clients[c].handle(m.encode(header(c), m.UnmaskRequest(
                alive, (d,), tuple(sorted(sigs_short.items())),
                ((h, *new.server._round.attestations[h]),))))
        except ClientAbort:
            continue
        shares = m.decode(reply, expect=m.UnmaskResponse)[1].shares
        d_key_shares += sum(1 for o, k, _ in shares if o == d and k == m.SHARE_OF_MASK_KEY)
    # One list per (session, round): never shares of both of d's secrets from honest holders.
    assert not (d_seed_shares and d_key_shares), (
        f"honest holders revealed {d_seed_shares} seed share(s) and {d_key_shares} mask-key share(s) "
        f"of client {d} in one (session, round): two survivor lists reached the quorum")


def test_a_rerun_of_one_session_and_round_cannot_get_two_survivor_lists_acted_on():
    """The attack needs a second instance of one identity in one (session, round): the honest
    client refuses to be that instance before drawing any key, so the attack cannot be set up."""
    with pytest.raises(ClientAbort) as info:
        _attack_a_rerun_of_one_session_and_round_cannot_get_two_survivor_lists_acted_on()
    assert info.value.reason == rules.SECOND_INSTANCE
