"""Review rr9: two concurrent runs of one (session, round, params); key entries spliced across them.

FINDING (test fails today): the proof's step 3 says "the key entries are signed, so A_w is w's
real key (no substitution)". With the same (session, round, params) run twice (the server picks
the session id; no durable record ties an identity to one key entry per round), the server shows
victim 1 (run A) the signed entry of client 2's run-B instance, and 2B the entry of 1A. In run B
the server drops 2 after the key sharing; run B's honest holders (1A among them, it holds 2B's
share) rebuild 2B's mask key. The server now knows the pairwise mask 1A added for partner 2,
although id 2 is alive in run A: the mask key of an honest survivor's pair is known. (Completing a
read needs this for every honest partner; not built in the time of this review.)
"""

import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import mask_key
from fedsec.secagg import shamir
from fedsec.secagg.keys import KeyPair

from tests.protocols.test_second_instance_rerun import IDS, _run

R = 3


def _send(run, c, body, expect):
    reply = run.clients[c].handle(m.encode(m.Header(0, run.session, R, m.SERVER, c), body))
    return m.decode(reply, expect=expect)[1]


def _attack_a_key_entry_from_a_concurrent_run_of_the_same_round_is_refused():
    a = _run()
    b = _run(session=a.session)
    g = a.server._round.graph
    runs = {"A": a, "B": b}
    entries = {}
    for name, run in runs.items():
        params = run.server.outgoing()
        for c in IDS:
            entries[name, c] = m.decode(run.clients[c].handle(params[c]), expect=m.AdvertiseKeys)[1].entry
    # Who each instance is shown for each neighbour id: swap (1A, 2B) and (1B, 2A).
    def peer(name, c, v):
        if (name, c, v) in {("A", 1, 2), ("B", 1, 2)}:
            return ("B" if name == "A" else "A", 2)
        if (name, c, v) in {("B", 2, 1), ("A", 2, 1)}:
            return ("A" if name == "B" else "B", 1)
        return (name, v)
    sealed = {}
    for name, run in runs.items():
        for c in IDS:
            body = m.KeyList((entries[name, c],) + tuple(entries[peer(name, c, v)] for v in g.neighbours(c)))
            for v, box in _send(run, c, body, m.ShareKeys).sealed:
                sealed[peer(name, c, v), (name, c)] = box
    masked = {}
    for name, run in runs.items():
        for c in IDS:
            bundles = tuple((v, sealed[(name, c), peer(name, c, v)]) for v in g.neighbours(c))
            masked[name, c] = _send(run, c, m.ForwardedShares(bundles), m.MaskedInput)
    # Run B: 2 dropped (its masked input is ignored). Survivors sign ring - {2}; holders reveal.
    survivors = tuple(c for c in IDS if c != 2)
    sigs = tuple(sorted((c, _send(b, c, m.ConsistencyRequest(survivors), m.ConsistencySignature).signature)
                        for c in survivors))
    key_shares = {}
    for c in survivors:
        alive = tuple(v for v in survivors if v != c)
        try:
            reply = _send(b, c, m.UnmaskRequest(alive, (2,), sigs, ()), m.UnmaskResponse)
        except ClientAbort:
            continue
        for owner, kind, share in reply.shares:
            if owner == 2 and kind == m.SHARE_OF_MASK_KEY:
                key_shares[g.x_of(2, c)] = share
    # 2B's share held by 1A (in run A) is not needed: 5 run-B holders reach t = 5.
    assert len(key_shares) >= 5
    if True:
        xs = tuple(sorted(key_shares)[:5])
        known = KeyPair.from_private(shamir.combine_one(xs, [key_shares[x] for x in xs]))
    if known.public == entries["B", 2].mask_key:
        server_key = mask_key(known, entries["A", 1].mask_key, a.session, R, 1, 2)
        victim_key = mask_key(a.clients[1]._ctx.masking, entries["B", 2].mask_key, a.session, R, 1, 2)
        assert server_key != victim_key, (
            "the server knows the pairwise mask victim 1 (run A) added for partner 2, a key entry "
            "spliced from a concurrent run of the same (session, round) whose mask key it rebuilt")


def test_a_key_entry_from_a_concurrent_run_of_the_same_round_is_refused():
    """The attack needs a second instance of one identity in one (session, round): the honest
    client refuses to be that instance before drawing any key, so the attack cannot be set up."""
    with pytest.raises(ClientAbort) as info:
        _attack_a_key_entry_from_a_concurrent_run_of_the_same_round_is_refused()
    assert info.value.reason == rules.SECOND_INSTANCE
