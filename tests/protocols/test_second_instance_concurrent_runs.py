"""Review rr9: concurrent runs of one (session, round, params) READ an honest input. FINDING (fails).

The server picks the session id and nothing durable ties an identity to one key entry, one
survivor list or one answer per (session, round). Zero colluders, complete graph n = 7, t = 5.
Run A: victim 1A is shown, for each partner id w, the signed entry of w's instance in a separate
run B_w (w_Bw is shown 1A's entry in return): 1A's seed shares go to the w_Bw, its pairwise masks
use their keys. Run A's own instances sign the full ring. In each B_w the server drops w: the other
B_w instances sign ring - {w} (their quorum) and reveal t shares of w_Bw's mask key; w_Bw itself is
shown the full ring with run A's signatures and reveals its share of 1A's seed. Each instance acts
on one list and no owner instance has both secrets revealed, so the threshold does not help; the
id-based rules (1 has t partners in S) are met by ids whose instances' keys are revealed elsewhere.
"""

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import mask_key, self_mask_key
from fedsec.secagg import shamir
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import KeyPair
from fedsec.secagg.prg import MaskExpander

from tests.protocols.test_second_instance_rerun import IDS, RING, _run

R, T = 3, 5


def _send(run, c, body, expect):
    reply = run.clients[c].handle(m.encode(m.Header(0, run.session, R, m.SERVER, c), body))
    return m.decode(reply, expect=expect)[1]


def _attack_concurrent_runs_of_one_round_never_read_an_input():
    a = _run()
    runs = {"A": a} | {w: _run(session=a.session) for w in IDS[1:]}
    g = a.server._round.graph
    entries = {}
    for name, run in runs.items():
        params = run.server.outgoing()
        for c in IDS:
            entries[name, c] = m.decode(run.clients[c].handle(params[c]), expect=m.AdvertiseKeys)[1].entry

    def peer(name, c, v):  # the instance whose entry (name, c) is shown for neighbour id v
        if name == "A" and c == 1:
            return (v, v)
        if name != "A" and c == name and v == 1:
            return ("A", 1)
        return (name, v)

    sealed = {}
    for name, run in runs.items():
        for c in IDS:
            shown = [v for v in g.neighbours(c) if not (name != "A" and c == 1 and v == name)]
            body = m.KeyList((entries[name, c],) + tuple(entries[peer(name, c, v)] for v in shown))
            for v, box in _send(run, c, body, m.ShareKeys).sealed:
                sealed[(name, c), peer(name, c, v)] = box
    masked = {}
    for name, run in runs.items():
        for c in IDS:
            bundles = tuple((v, sealed[peer(name, c, v), (name, c)]) for v in g.neighbours(c)
                            if (peer(name, c, v), (name, c)) in sealed)
            masked[name, c] = _send(run, c, m.ForwardedShares(bundles), m.MaskedInput)
    # Run A signs the full ring.
    sig_a = tuple(sorted((c, _send(a, c, m.ConsistencyRequest(RING), m.ConsistencySignature).signature)
                         for c in IDS))
    seed_shares, keys = {}, {}
    for w in IDS[1:]:
        b, short = runs[w], tuple(c for c in IDS if c != w)
        sigs = tuple(sorted((c, _send(b, c, m.ConsistencyRequest(short), m.ConsistencySignature).signature)
                            for c in short))
        pts = {}
        for c in short:
            partners = [v for v in g.neighbours(c) if v != c and not (c == 1 and v == w)]
            alive = tuple(v for v in partners if v != w)
            dropped = (w,) if w in partners else ()
            for owner, kind, share in _send(b, c, m.UnmaskRequest(alive, dropped, sigs, ()),
                                            m.UnmaskResponse).shares:
                if owner == w and kind == m.SHARE_OF_MASK_KEY:
                    pts[g.x_of(w, c)] = share
        xs = tuple(sorted(pts)[:T])
        keys[w] = KeyPair.from_private(shamir.combine_one(xs, [pts[x] for x in xs]))
        assert keys[w].public == entries[w, w].mask_key
        # w_Bw: the full ring, run A's signatures; it reveals its share of 1A's seed.
        _send(b, w, m.ConsistencyRequest(RING), m.ConsistencySignature)
        alive = tuple(v for v in g.neighbours(w) if v != w)
        for owner, kind, share in _send(b, w, m.UnmaskRequest(alive, (), sig_a, ()), m.UnmaskResponse).shares:
            if owner == 1 and kind == m.SHARE_OF_SEED:
                seed_shares[g.x_of(1, w)] = share
    xs = tuple(sorted(seed_shares)[:T])
    seed = shamir.combine_one(xs, [seed_shares[x] for x in xs])
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=len(IDS), max_weight=5, max_length=3)
    words = encoder.from_bytes(masked["A", 1].words, 5)
    expander = MaskExpander(length=5, modulus_bits=encoder.modulus_bits)
    expander.add_into(self_mask_key(seed, a.session, R, 1), words, sign=-1)
    for w in IDS[1:]:
        expander.add_into(mask_key(keys[w], entries["A", 1].mask_key, a.session, R, 1, w), words, sign=-1)
    encoder.reduce(words)
    plain = encoder.encode(np.full(3, 0.1, np.float32), 1, rng=np.random.default_rng(1)).words
    assert not np.array_equal(words, plain), "the server read victim 1's encoded input exactly"


def test_concurrent_runs_of_one_round_never_read_an_input():
    """The attack needs a second instance of one identity in one (session, round): the honest
    client refuses to be that instance before drawing any key, so the attack cannot be set up."""
    with pytest.raises(ClientAbort) as info:
        _attack_concurrent_runs_of_one_round_never_read_an_input()
    assert info.value.reason == rules.SECOND_INSTANCE
