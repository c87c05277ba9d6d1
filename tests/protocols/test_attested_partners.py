"""The server removes masks from the survivors' attested partner sets, and keeps the clients of the
sum in the sum.

Adversaries: a lossy or partial forwarding of share bundles (a lost record, a lying relay that
the honest server does not know about), a lying client whose attestation names a partner it never
had, and a survivor whose consistency signature or unmask answer is malformed. Honest parties are
the project's unmodified ``MaskedServer`` and ``MaskedClient``s. Outcomes: the exact sum of the
clients the server names as survivors, or ``ProtocolAbort``; never a wrong sum.
"""

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked import aggregation as layer_module
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import attestation_message
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance, tampered
from tests.protocols.test_masked_keys_and_shares import Rewriting


def _finish(s, skip=()):
    while not s.server.done:
        for c, message in s.server.outgoing().items():
            if c in skip:
                continue
            try:
                s.server.receive(c, s.clients[c].handle(message))
            except ClientAbort:
                continue
        s.server.close()


def test_a_lost_bundle_and_a_dropout_give_the_exact_sum():
    """Review r9 finding 5: one record of one client's forwarded set is lost and its sender drops
    before its masked input. The server removes that sender's masks for exactly the survivors that
    attested it as a partner: the victim is not asked about it and the sum is exact."""
    s = make_session(7, seed=11, length=6)
    out = advance(s, "masked input")
    victim, gone = sorted(out)[:2]
    for c, message in out.items():
        if c == gone:
            continue
        if c == victim:
            message = tampered(message, m.ForwardedShares,
                               lambda b: m.ForwardedShares(tuple(x for x in b.sealed if x[0] != gone)))
        s.server.receive(c, s.clients[c].handle(message))
    s.server.close()
    _finish(s)
    total, survivors = s.server.result()
    assert victim in survivors and gone not in survivors
    assert not s.server.rejected and not s.server.misbehaved
    assert all(client.abort_reason is None for client in s.clients.values())
    assert np.array_equal(total, s.expected_sum(survivors))


def test_a_bundle_lost_between_two_survivors_aborts_before_anything_is_revealed():
    s = make_session(7, seed=12, length=6)
    out = advance(s, "masked input")
    victim, other = sorted(out)[:2]
    out[victim] = tampered(out[victim], m.ForwardedShares,
                           lambda b: m.ForwardedShares(tuple(x for x in b.sealed if x[0] != other)))
    for c, message in out.items():
        s.server.receive(c, s.clients[c].handle(message))
    with pytest.raises(ProtocolAbort, match="cannot cancel"):
        s.server.close()  # other masked with victim, victim not with other
    assert s.server.stage == "aborted"


def test_an_attestation_naming_a_partner_never_forwarded_removes_its_sender():
    """A lying client signs a bitmap that names a neighbour which never shared its keys (so the
    server never forwarded its bundle): the server rejects it before its input enters the total."""
    s = make_session(7, seed=13, length=6)
    out = advance(s, "share keys")
    liar, gone = sorted(out)[:2]
    for c, message in out.items():
        if c != gone:  # gone advertised its keys, then dropped before sharing
            s.server.receive(c, s.clients[c].handle(message))
    s.server.close()
    x = s.graph.x_of(liar, gone)

    def claim(body):
        bits = bytearray(body.partners)
        bits[(x - 1) // 8] |= 1 << ((x - 1) % 8)
        signature = s.identities[liar].sign(attestation_message(
            s.session, s.round_index, liar, bytes(bits), params=s.server._round.digest))
        return m.MaskedInput(body.words, bytes(bits), signature)

    for c, message in s.server.outgoing().items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, tampered(reply, m.MaskedInput, claim) if c == liar else reply)
    assert "never sent" in s.server.rejected[liar]
    s.server.close()
    _finish(s)
    total, survivors = s.server.result()
    assert liar not in survivors and np.array_equal(total, s.expected_sum(survivors))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(4, 8), graph=st.sampled_from(["complete", "harary"]), seed=st.integers(0, 2**16),
       data=st.data())
def test_random_lost_bundles_never_release_a_wrong_sum(n, graph, seed, data):
    s = make_session(n, graph=graph, seed=seed, length=5, dropout=0.3)
    out = advance(s, "masked input")
    ids = sorted(out)
    lost = {c: data.draw(st.sets(st.sampled_from(s.graph.neighbours(c)), max_size=2), label=f"lost {c}")
            for c in ids}
    gone = data.draw(st.sets(st.sampled_from(ids), max_size=2), label="drop before masked input")
    for c, message in out.items():
        if c in gone:
            continue
        keep = lambda b, c=c: m.ForwardedShares(tuple(x for x in b.sealed if x[0] not in lost[c]))  # noqa: E731
        message = tampered(message, m.ForwardedShares, keep)
        try:
            s.server.receive(c, s.clients[c].handle(message))
        except ClientAbort:
            continue  # fewer than t bundles: it refuses to mask
    try:
        s.server.close()
        _finish(s)
    except ProtocolAbort:
        return
    total, survivors = s.server.result()
    assert np.array_equal(total, s.expected_sum(survivors))


@pytest.mark.parametrize("stage", ["consistency check", "unmask"])
def test_a_malformed_answer_after_the_masked_input_is_recorded_as_misbehaviour(stage):
    """Review r9 finding 4: the client's input is in the total, so it cannot leave the sum; it is
    listed in ``misbehaved`` (a non-signer / non-answerer), never in ``rejected``."""
    s = make_session(8, seed=3)
    out = advance(s, stage)
    bad = sorted(out)[0]
    for c, message in out.items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, reply[:-1] if c == bad else reply)
    s.server.receive(bad, reply)  # whatever it sends afterwards is not taken
    s.server.close()
    _finish(s)
    total, survivors = s.server.result()
    assert bad in survivors and np.array_equal(total, s.expected_sum(survivors))
    assert bad not in s.server.rejected and s.server.misbehaved[bad].startswith(stage)
    if stage == "consistency check":
        assert bad not in s.server._round.signatures


def test_the_layer_counts_a_misbehaving_survivor_as_a_participant_not_a_rejection(monkeypatch):
    real = layer_module.run_round
    liar = {}

    def with_a_liar(server, clients, **kwargs):
        c = liar["id"] = sorted(clients)[0]
        truncate = lambda body: m.UnmaskResponse(body.shares[:-1])  # noqa: E731 - one answer short
        return real(server, {**clients, c: Rewriting(clients[c], m.UnmaskResponse, truncate)}, **kwargs)

    monkeypatch.setattr(layer_module, "run_round", with_a_liar)
    rng = np.random.default_rng(4)
    updates = [ClientUpdate(client_id=c, vector=rng.normal(0, 0.3, 5), weight=2) for c in range(6)]
    layer = MaskedAggregation(max_weight=5, rng=np.random.default_rng(0))
    result = layer.aggregate(1, updates)
    assert liar["id"] in result.participants and len(result.participants) == 6
    assert result.metrics["rejected"] == 0 and result.metrics["misbehaved"] == 1
    assert list(layer.last_misbehaved) == [liar["id"]] and layer.last_rejected == []
    expected = sum(u.vector for u in updates) * 2
    assert np.allclose(result.weighted_sum, expected, atol=6 * 2 * 2 / (2**16 - 1) + 1e-9)
