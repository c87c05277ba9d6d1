"""Items 5 and 6 of issue 9: small-order keys and secrets that are not 32-byte strings.

Adversaries, each against the project's unmodified honest parties:
- one client (possibly with a valid long-term signature) advertises a small-order or
  non-canonical X25519 key: the honest server rejects and records it, the round finishes exactly
  with the others;
- a lying server (alone, or with one colluding neighbour who signs the key) puts such a key into
  an honest client's key list, searching over every bad encoding and every entry: the client
  raises ClientAbort(BAD_KEY), never CryptoError, and answers nothing afterwards;
- one client deals Shamir shares of a value in [2^256, p) (every share a valid field element) for
  its seed or its mask key, and commits to them in its signed key entry (so the share commitments
  of issue 9A do not catch it): the server ends the round with a ProtocolAbort, never another error;
- one share holder answers with a share >= p: it is recorded as misbehaving (a non-answerer that
  stays in the sum), the round finishes.
"""

from __future__ import annotations

import dataclasses
import secrets
import types

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation, run_round
from fedsec.protocols.masked import aggregation as seam
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import commitment_digest, key_message, share_box_context, share_hash
from fedsec.secagg import keys as crypto
from fedsec.secagg import shamir
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from tests.protocols.helpers import make_session
from tests.secagg.test_public_keys import SMALL_ORDER_ENCODINGS

BAD_KEYS = SMALL_ORDER_ENCODINGS + [(crypto.FIELD_PRIME + 2).to_bytes(32, "little"), b"\xff" * 32]


class Rewriting:
    """A client the adversary controls: the honest state machine, with one reply rewritten."""

    def __init__(self, inner, kind: type, change) -> None:
        self.inner, self.kind, self.change = inner, kind, change

    def handle(self, data: bytes) -> bytes | None:
        reply = self.inner.handle(data)
        if reply is None:
            return None
        header, body = m.decode(reply, expect=m.MESSAGE_TYPES[reply[4]])  # byte 4: the kind
        if isinstance(body, self.kind):
            body = self.change(body)
        return m.encode(header, body)


def advertising(s, liar: int, bad: bytes, field: str):
    """The liar advertises ``bad`` as one of its keys, signing it when the session is active."""
    def change(body: m.AdvertiseKeys) -> m.AdvertiseKeys:
        e = dataclasses.replace(body.entry, **{field: bad})
        if e.signature:
            e = dataclasses.replace(e, signature=s.identities[liar].sign(key_message(
                s.session, s.round_index, liar, e.encryption_key, e.mask_key, e.commitment,
                params=s.clients[liar]._ctx.digest)))
        return m.AdvertiseKeys(e)

    return Rewriting(s.clients[liar], m.AdvertiseKeys, change)


@pytest.mark.parametrize("active", [False, True])
@pytest.mark.parametrize("graph", ["complete", "harary"])
@pytest.mark.parametrize("field", ["encryption_key", "mask_key"])
def test_a_client_advertising_a_small_order_key_is_rejected_and_the_round_goes_on(graph, active, field):
    s = make_session(9, length=20, graph=graph, active=active, seed=11)
    liar = sorted(s.clients)[3]
    clients = dict(s.clients)
    clients[liar] = advertising(s, liar, BAD_KEYS[(len(field) + active) % len(BAD_KEYS)], field)
    trace = run_round(s.server, clients)
    total, survivors = s.server.result()
    assert liar not in survivors and len(survivors) == 8 and not trace.aborts
    assert s.server.rejected == {liar: "a public key is malformed or of small order"}
    assert np.array_equal(total, s.expected_sum(survivors))


@settings(max_examples=12)
@given(bad=st.sampled_from(BAD_KEYS), field=st.sampled_from(["encryption_key", "mask_key"]),
       which=st.integers(0, 20), active=st.booleans())
def test_a_lying_server_putting_a_bad_key_in_a_key_list_gets_a_client_abort(bad, field, which, active):
    s = make_session(6, length=8, active=active, seed=12)
    while s.server.stage != "share keys":
        for c, message in s.server.outgoing().items():
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    out = s.server.outgoing()
    victim = sorted(out)[0]
    header, body = m.decode(out[victim], expect=m.KeyList)
    others = [e for e in body.entries if e.client != victim]
    target = others[which % len(others)]
    forged = dataclasses.replace(target, **{field: bad})
    if active:  # the neighbour colludes with the server and signs the bad key
        forged = dataclasses.replace(forged, signature=s.identities[target.client].sign(key_message(
            s.session, s.round_index, target.client, forged.encryption_key, forged.mask_key,
            forged.commitment, params=s.clients[target.client]._ctx.digest)))
    message = m.encode(header, m.KeyList(tuple(forged if e is target else e for e in body.entries)))
    with pytest.raises(ClientAbort) as info:
        s.clients[victim].handle(message)
    assert info.value.reason == rules.BAD_KEY
    assert s.clients[victim].stage == "aborted"
    with pytest.raises(ClientAbort):  # it answers nothing afterwards, even the honest message
        s.clients[victim].handle(out[victim])


def test_aggregate_survives_a_client_that_advertises_a_small_order_key(monkeypatch):
    honest_build = seam.build_round
    liars = []

    def build_with_a_liar(**kwargs):
        built = honest_build(**kwargs)
        liar = built.graph.ring[0]
        liars.append(liar)
        built.clients[liar] = Rewriting(built.clients[liar], m.AdvertiseKeys, lambda b: m.AdvertiseKeys(
            dataclasses.replace(b.entry, mask_key=bytes(32))))
        return built

    monkeypatch.setattr(seam, "build_round", build_with_a_liar)
    rng = np.random.default_rng(4)
    updates = [fl_core.ClientUpdate(c, rng.normal(0, 0.2, 30).astype(np.float32), float(c + 1))
               for c in range(8)]
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=20)
    result = protocol.aggregate(1, updates)
    (liar,) = liars
    assert liar not in result.participants and result.dropped == (liar,)
    assert result.metrics["rejected"] == 1
    assert [(r.client_id, r.reason) for r in protocol.last_rejected] == [
        (liar, "a public key is malformed or of small order")]
    plain = fl_core.PlainAggregation().aggregate(1, [u for u in updates if u.client_id != liar])
    assert result.total_weight == plain.total_weight
    assert np.abs(result.weighted_sum - plain.weighted_sum).max() <= plain.total_weight * 2 / (2**20 - 1)


def _dealing(s, liar: int, value: int, kind: int):
    """The liar deals shares of ``value`` (a field element) instead of its seed or mask key.

    It commits to the shares it deals (the share hashes and their digest in its signed key
    entry), so every commitment check passes and the bad secret reaches the reconstruction."""
    inner = s.clients[liar]

    def change(body: m.AdvertiseKeys) -> m.AdvertiseKeys:
        ctx = inner._ctx  # the adversary's own client: it rewrites its shares before advertising
        coefficients = [value] + [secrets.randbelow(shamir.PRIME) for _ in range(s.threshold - 1)]
        xs = range(1, ctx.params.degree + 1)
        shares = ctx.shares.copy()
        shares[kind] = [sum(c * pow(x, i, shamir.PRIME) for i, c in enumerate(coefficients)) % shamir.PRIME
                        for x in xs]
        ctx.shares = shares
        ctx.commitments = b"".join(
            share_hash(ctx.session, ctx.round_index, liar, x, k, shamir.share_to_bytes(int(shares[k, x - 1])))
            for x in xs for k in (m.SHARE_OF_SEED, m.SHARE_OF_MASK_KEY))
        e = dataclasses.replace(body.entry, commitment=commitment_digest(ctx.commitments))
        if e.signature:
            e = dataclasses.replace(e, signature=ctx.signing_key.sign(key_message(
                ctx.session, ctx.round_index, liar, e.encryption_key, e.mask_key, e.commitment,
                params=ctx.digest)))
        return m.AdvertiseKeys(e)

    return Rewriting(inner, m.AdvertiseKeys, change)


@settings(max_examples=6)
@given(excess=st.integers(0, shamir.PRIME - 2**256 - 1), kind=st.sampled_from([m.SHARE_OF_SEED,
                                                                                  m.SHARE_OF_MASK_KEY]),
       graph=st.sampled_from(["complete", "harary"]))
def test_a_secret_above_2_256_ends_the_round_with_a_protocol_abort(excess, kind, graph):
    s = make_session(9, length=10, graph=graph, seed=13)
    liar = sorted(s.clients)[2]
    clients = dict(s.clients)
    clients[liar] = _dealing(s, liar, 2**256 + excess, kind)
    # For the mask key to be rebuilt the liar must drop after sharing (stage 2).
    drops = {liar: 2} if kind == m.SHARE_OF_MASK_KEY else {}
    with pytest.raises(ProtocolAbort, match="do not rebuild a 32-byte secret"):
        run_round(s.server, clients, drop_at=drops)
    assert s.server.stage == "aborted"
    with pytest.raises(ProtocolAbort):
        s.server.result()


def test_an_unmask_share_outside_the_field_records_its_sender_and_the_round_finishes():
    s = make_session(8, length=12, seed=14)
    liar = sorted(s.clients)[1]

    def change(body: m.UnmaskResponse) -> m.UnmaskResponse:
        (owner, kind, _), *rest = body.shares
        return m.UnmaskResponse(((owner, kind, (2**264 - 1).to_bytes(33, "big")), *rest))

    clients = dict(s.clients)
    clients[liar] = Rewriting(s.clients[liar], m.UnmaskResponse, change)
    run_round(s.server, clients)
    total, survivors = s.server.result()
    assert s.server.misbehaved == {liar: "unmask: a share is not a field element"} and not s.server.rejected
    assert liar in survivors and np.array_equal(total, s.expected_sum(survivors))


def test_a_forwarded_share_outside_the_field_is_a_client_abort():
    s = make_session(6, length=8, seed=15)
    liar = sorted(s.clients)[0]

    def change(body: m.ShareKeys) -> m.ShareKeys:
        ctx = s.clients[liar]._ctx
        out = []
        for v, blob in body.sealed:
            aad = share_box_context(s.session, s.round_index, liar, v)
            plain = shamir.PRIME.to_bytes(33, "big") + crypto.open_sealed(ctx.box_keys[v], blob, aad)[33:]
            out.append((v, crypto.seal(ctx.box_keys[v], plain, aad)))
        return m.ShareKeys(tuple(out), body.commitments)

    clients = dict(s.clients)
    clients[liar] = Rewriting(s.clients[liar], m.ShareKeys, change)
    with pytest.raises(ProtocolAbort):  # every honest client refuses: too few are left
        run_round(s.server, clients)
    honest = [c for c in s.clients if c != liar]
    assert all(s.clients[c].abort_reason == rules.SHARE_AUTH for c in honest)


@pytest.mark.parametrize("bad", BAD_KEYS, ids=lambda b: b.hex()[:6] + b.hex()[-2:])
def test_the_server_refuses_every_bad_encoding_at_advertisement(bad):
    s = make_session(5, length=4, seed=16)
    out = s.server.outgoing()
    for c in sorted(out):
        reply = s.clients[c].handle(out[c])
        if c == min(out):
            header, body = m.decode(reply, expect=m.AdvertiseKeys)
            reply = m.encode(header, m.AdvertiseKeys(dataclasses.replace(body.entry, encryption_key=bad)))
        s.server.receive(c, reply)
    assert s.server.rejected == {min(out): "a public key is malformed or of small order"}


@pytest.mark.parametrize("kind", [m.SHARE_OF_SEED, m.SHARE_OF_MASK_KEY])
def test_a_secret_above_2_256_never_raises_past_the_seam(monkeypatch, kind):
    honest_build = seam.build_round

    def build_with_a_dealer_of_bad_shares(**kwargs):
        built = honest_build(**kwargs)
        liar = built.graph.ring[1]
        # A constant polynomial: every share equals the bad value, whatever t is.
        view = types.SimpleNamespace(clients=built.clients, session=built.session, graph=built.graph,
                                     round_index=kwargs["round_index"], threshold=1)
        built.clients[liar] = _dealing(view, liar, shamir.PRIME - 1, kind)
        if kind == m.SHARE_OF_MASK_KEY:  # it must drop for its mask key to be rebuilt
            built.clients[liar] = _Silent(built.clients[liar], after=2)
        return built

    monkeypatch.setattr(seam, "build_round", build_with_a_dealer_of_bad_shares)
    rng = np.random.default_rng(5)
    updates = [fl_core.ClientUpdate(c, rng.normal(0, 0.2, 16).astype(np.float32), 2.0) for c in range(7)]
    with pytest.raises(ProtocolAbort, match="do not rebuild a 32-byte secret"):
        MaskedAggregation(max_weight=10, rng=np.random.default_rng(0)).aggregate(1, updates)


class _Silent:
    """Answers the first ``after`` messages, then drops out (says nothing more)."""

    def __init__(self, inner, *, after: int) -> None:
        self.inner, self.left = inner, after

    def handle(self, data: bytes) -> bytes | None:
        self.left -= 1
        return self.inner.handle(data) if self.left >= 0 else None
