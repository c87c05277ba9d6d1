"""Signed artefacts replayed across sessions and rounds are refused (from review r9).

The same clients (same long-term identities, ids, ring, degree and threshold) take part in two
sessions, or two rounds of one session. The lying server keeps everything signed in the first one
(key entries, partner attestations, survivor-list signatures) and splices it into the second, into
one honest client's key list or unmask request. Every splice is refused with the documented reason.
"""

import copy
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


def _round(round_index, session=None):
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=len(IDS), max_weight=5, max_length=3)
    built = build_round(updates={c: np.full(3, 0.1 * c, np.float32) for c in IDS},
                        weights=dict.fromkeys(IDS, 1), rngs={c: np.random.default_rng(c) for c in IDS},
                        encoder=encoder, degree=6, threshold=5, round_index=round_index,
                        identities=IDENTITIES, corrupt=0.2)
    ring = tuple(IDS)
    if session is not None:
        built.session = session
    for c in IDS:  # same ring order and session id in every run (the server chooses both)
        built.clients[c]._ctx.session = built.session
    built.server._round.session = built.session
    built.server._round.graph = RingGraph(ring, 6)
    params = dataclasses.replace(built.server._round.params, ring=ring)
    built.server._round.params, built.server._round.digest = params, m.params_digest(params)
    return built


def _play(built, until=None, capture=None):
    server = built.server
    while not server.done and server.stage != until:
        for c, message in server.outgoing().items():
            reply = built.clients[c].handle(message)
            if capture is not None:
                capture.setdefault(server.stage, {})[c] = (message, reply)
            server.receive(c, reply)
        server.close()
    return server.outgoing() if not server.done else {}


@pytest.mark.parametrize("other", ["session", "round"])
def test_signed_artefacts_from_another_run_are_refused(other):
    old, captured = _round(3), {}
    _play(old, capture=captured)
    assert old.server.done
    new = _round(4 if other == "round" else 3, session=None if other == "session" else old.session)
    victim = IDS[0]

    # 1. An old key entry of a neighbour in the victim's new key list.
    out = _play(new, until="share keys")
    stale = m.decode(captured["advertise keys"][IDS[1]][1], expect=m.AdvertiseKeys)[1].entry
    header, body = m.decode(out[victim], expect=m.KeyList)
    spliced = m.KeyList(tuple(stale if e.client == stale.client else e for e in body.entries))
    with pytest.raises(ClientAbort) as info:
        new.clients[victim].handle(m.encode(header, spliced))
    assert info.value.reason == rules.BAD_SIGNATURE

    # 2. Old survivor signatures and attestations in an unmask request of the new run.
    for c, message in out.items():
        if c != victim:
            new.server.receive(c, new.clients[c].handle(message))
    new.server.close()
    out = _play(new, until="unmask")
    holder = sorted(out)[0]
    old_request = m.decode(captured["unmask"][holder][0], expect=m.UnmaskRequest)[1]
    header, body = m.decode(out[holder], expect=m.UnmaskRequest)
    owner = body.alive[0]
    old_input = m.decode(captured["masked input"][owner][1], expect=m.MaskedInput)[1]
    splices = [
        dataclasses.replace(body, signatures=old_request.signatures),
        dataclasses.replace(body, signatures=body.signatures[:1] + old_request.signatures[1:]),
        dataclasses.replace(body, signatures=tuple(x for x in body.signatures if x[0] != owner),
                            attestations=((owner, old_input.partners, old_input.signature),)),
    ]
    for spliced in splices:
        holder_copy = copy.deepcopy(new.clients[holder])
        with pytest.raises(ClientAbort) as info:
            holder_copy.handle(m.encode(header, spliced))
        assert info.value.reason in (rules.BAD_SIGNATURE, rules.INCONSISTENT, rules.ATTESTATION,
                                     rules.FEW_SURVIVORS)
    # The unspliced request is answered.
    assert new.clients[holder].handle(out[holder])
