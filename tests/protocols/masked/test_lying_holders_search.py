"""Adversary: up to c colluding clients that lie in their unmask answers (the server and every other
client honest and unmodified). Each liar, independently, replaces some of its shares by another
field element, by the share it holds of another owner, by its share of the owner's other secret,
or by an honest holder's share of the same secret (right secret, wrong x). The server checks every
share against its owner's signed commitments, rebuilds from the smallest x-coordinates whose
shares check, and so either releases the exact sum or aborts, never a wrong sum; it lists exactly
the liars that changed a share. A random search over liars and lies at n = 8 (complete graph) and
n = 12 (SecAgg+), with one client dropped after sharing its keys (so both kinds of share are
asked for).
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import messages as m
from fedsec.secagg import shamir

from tests.protocols.helpers import make_session

LIES = ("other element", "another owner's share", "the other secret", "another holder's share")


def _to_unmask(s, dropped):
    """Run the round with ``dropped`` silent from the masked input on; the unmask requests."""
    while s.server.stage != "unmask":
        for c, message in s.server.outgoing().items():
            if c == dropped and s.server.stage != "advertise keys" and s.server.stage != "share keys":
                continue
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    return s.server.outgoing()


def _lie(rng, shares, held, others):
    """A lying answer: some of ``shares`` (owner, kind, bytes) replaced; ``held`` is the liar's
    (seed share, key share) by owner, ``others`` honest holders' answers by owner and kind."""
    shares = list(shares)
    for i in rng.choice(len(shares), size=int(rng.integers(1, len(shares) + 1)), replace=False).tolist():
        owner, kind, share = shares[i]
        lie = LIES[int(rng.integers(len(LIES)))]
        if lie == "other element":
            value = (shamir.share_from_bytes(share) + int(rng.integers(1, 2**62))) % shamir.PRIME
        elif lie == "another owner's share":
            other = [o for o in held if o != owner]
            value = held[other[int(rng.integers(len(other)))]][kind] if other else 0
        elif lie == "the other secret":
            value = held[owner][1 - kind]
        else:
            candidates = [v for v in others.get((owner, kind), []) if v != share]
            value = shamir.share_from_bytes(candidates[0]) if candidates else 0
        shares[i] = (owner, kind, shamir.share_to_bytes(value))
    return tuple(shares)


@pytest.mark.parametrize("n,graph", [(8, "complete"), (12, "harary")])
def test_lying_holders_get_the_exact_sum_or_an_abort_and_are_all_listed(n, graph):
    rng = np.random.default_rng(2026)
    outcomes = set()
    for trial in range(8):
        s = make_session(n, graph=graph, seed=trial, length=20)
        dropped = s.graph.ring[int(rng.integers(n))]
        requests = _to_unmask(s, dropped)
        holders = sorted(requests)
        liars = set(rng.choice(holders, size=int(rng.integers(1, 3)), replace=False).tolist())
        held = {c: {v: pair for v, pair in s.clients[c]._ctx.received.items()} for c in liars}
        replies = {c: s.clients[c].handle(requests[c]) for c in holders}
        answers = {c: m.decode(replies[c], expect=m.UnmaskResponse)[1].shares for c in holders}
        others: dict[tuple[int, int], list[bytes]] = {}
        for c in holders:
            for owner, kind, share in answers[c]:
                others.setdefault((owner, kind), [])
                if c not in liars:
                    others[(owner, kind)].append(share)
        changed = set()
        for c in holders:
            reply = replies[c]
            if c in liars:
                header, _ = m.decode(reply, expect=m.UnmaskResponse)
                lied = _lie(rng, answers[c], held[c], others)
                if lied != answers[c]:
                    changed.add(c)
                reply = m.encode(header, m.UnmaskResponse(lied))
            s.server.receive(c, reply)
        try:
            s.server.close()
        except ProtocolAbort:
            # Only when some secret the server needs kept fewer than t shares that check.
            assert any(len(shares) < s.threshold for shares in others.values()), f"trial {trial}"
            outcomes.add("abort")
        else:
            total, survivors = s.server.result()
            assert np.array_equal(total, s.expected_sum(survivors)), f"trial {trial}: a wrong sum"
            outcomes.add("sum")
        listed = {c for c, why in s.server.misbehaved.items() if "does not match its commitment" in why}
        assert listed == changed, f"trial {trial}: listed {listed}, changed {changed}"
    assert "sum" in outcomes
