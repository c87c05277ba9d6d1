"""A server that lies: every honest client refuses, and no sum or secret leaks through them."""

import dataclasses

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import ClientPolicy, MaskedAggregation, MaskedClient, MaskedServer
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import mask_key, self_mask_key, share_box_context, share_box_key
from fedsec.protocols.masked.policy import corrupt_count, minimum_threshold, survivor_quorum
from fedsec.secagg import shamir
from fedsec.secagg.keys import KeyPair, open_sealed, seal
from fedsec.secagg.prg import MaskExpander

from fedsec.config import SecureConfig
from tests.protocols.adversary import Strategy, finish, make_world, prepare
from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance, tampered


def answers(s, out, change):
    """Deliver ``change(client, message)`` to every client; return {client: reply or abort reason}."""
    result = {}
    for c, message in out.items():
        try:
            result[c] = s.clients[c].handle(change(c, message))
        except ClientAbort as abort:
            result[c] = abort.reason
    return result


def test_asking_for_both_secrets_of_one_client_is_refused_by_everyone():
    s = make_session(8, seed=11)
    out = advance(s, "unmask")
    victim = sorted(s.clients)[3]
    replies = answers(s, out, lambda c, msg: tampered(msg, m.UnmaskRequest, lambda b: dataclasses.replace(
        b, dropped=b.dropped + ((victim,) if victim in b.alive else ()))))
    # Everyone who holds shares of the victim refuses; the victim's own request was unchanged.
    assert all(reply == rules.BOTH_LISTS for c, reply in replies.items() if c != victim)


def test_split_view_of_survivors_is_caught_in_active_mode():
    """The server tells half the clients a survivor dropped: signatures over the list betray it."""
    s = make_session(8, seed=12, active=True)
    out = advance(s, "unmask")
    victim = sorted(s.clients)[0]
    half = set(sorted(s.clients)[4:])

    def lie(c, msg):
        if c not in half or c == victim:
            return msg
        return tampered(msg, m.UnmaskRequest, lambda b: dataclasses.replace(
            b, alive=tuple(v for v in b.alive if v != victim), dropped=b.dropped + (victim,)))

    replies = answers(s, out, lie)
    assert all(replies[c] == rules.INCONSISTENT for c in half if c != victim)


def test_different_survivor_lists_at_the_consistency_check_are_caught():
    s = make_session(8, seed=13, active=True)
    out = advance(s, "consistency check")
    first = sorted(out)[0]
    full = m.decode(out[first], expect=m.ConsistencyRequest)[1].survivors
    shorter = tuple(v for v in full if v != max(v for v in full if v != first))
    s.server.receive(first, s.clients[first].handle(
        tampered(out[first], m.ConsistencyRequest, lambda b: m.ConsistencyRequest(shorter))))
    for c, msg in out.items():
        if c != first:
            s.server.receive(c, s.clients[c].handle(msg))
    # An honest server sees the signature is over another list: ``first`` is a non-signer, recorded
    # as misbehaving, and stays in the sum (its masked input is already in the total).
    assert first in s.server.misbehaved and first not in s.server.rejected
    s.server.close()
    # A lying server goes on anyway and shows ``first`` the others' signatures (over the full list).
    template = next(iter(s.server.outgoing().values()))
    header, body = m.decode(template, expect=m.UnmaskRequest)
    forged = m.encode(dataclasses.replace(header, recipient=first), m.UnmaskRequest(
        alive=tuple(v for v in shorter if v != first), dropped=(),
        signatures=tuple((v, sig) for v, sig in body.signatures if v != first)))
    try:
        s.clients[first].handle(forged)
        raise AssertionError("the client answered a forged unmask request")
    except ClientAbort as abort:
        assert abort.reason == rules.BAD_SIGNATURE


def test_equivocated_key_list_is_refused_in_active_mode():
    """The server swaps one client's keys for its own in what everyone else sees."""
    s = make_session(8, seed=14, active=True)
    out = advance(s, "share keys")
    target = sorted(s.clients)[2]
    mallory = KeyPair.generate().public, KeyPair.generate().public
    replies = answers(s, out, lambda c, msg: tampered(msg, m.KeyList, lambda b: m.KeyList(tuple(
        dataclasses.replace(e, encryption_key=mallory[0], mask_key=mallory[1])
        if e.client == target and c != target else e for e in b.entries))))
    assert all(replies[c] == rules.BAD_SIGNATURE for c in s.clients if c != target)


def test_replaying_an_old_round_is_refused_by_everyone():
    old = make_session(6, seed=15, round_index=7)
    old_out = advance(old, "share keys")
    new = make_session(6, seed=15, round_index=8)
    advance(new, "share keys")
    # Same client ids (same seed), the server replays round 7's key lists into round 8.
    replies = answers(new, {c: old_out[c] for c in new.clients}, lambda c, msg: msg)
    assert set(replies.values()) == {rules.REPLAY}


# --- Issue 9, breaks 1-4: each played against unmodified clients --------------------------------


def test_break_1_key_substitution_reads_the_victim_in_the_semi_honest_opt_in_only():
    """The server puts its own keys between a victim and every neighbour and opens the victim's
    share bundles. Semi-honest clients (the documented opt-in) cannot tell; authenticated ones can."""
    s = make_session(6, seed=21, active=False)
    out = advance(s, "share keys")
    victim = sorted(s.clients)[0]
    mallory = {c: (KeyPair.generate(), KeyPair.generate()) for c in s.clients if c != victim}
    body = m.decode(out[victim], expect=m.KeyList)[1]
    forged = m.KeyList(tuple(e if e.client == victim else dataclasses.replace(
        e, encryption_key=mallory[e.client][0].public, mask_key=mallory[e.client][1].public)
        for e in body.entries))
    own = next(e for e in body.entries if e.client == victim)
    shares = m.decode(s.clients[victim].handle(tampered(out[victim], m.KeyList, lambda b: forged)),
                      expect=m.ShareKeys)[1]
    # The server opens every bundle with its own keys: all k shares of both secrets.
    points = {}
    for holder, blob in shares.sealed:
        box = share_box_key(mallory[holder][0], own.encryption_key, s.session, s.round_index, victim, holder)
        plain = open_sealed(box, blob, share_box_context(s.session, s.round_index, victim, holder))
        points[s.graph.x_of(victim, holder)] = (plain[: shamir.SHARE_BYTES], plain[shamir.SHARE_BYTES:])
    xs = tuple(sorted(points)[: s.threshold])
    seed = shamir.combine_one(xs, [points[x][0] for x in xs])
    # It forwards bundles sealed to the victim under its own keys too, so the victim masks with them.
    fake = tuple((v, seal(share_box_key(mallory[v][0], own.encryption_key, s.session, s.round_index, v,
                                        victim),
                          bytes(2 * shamir.SHARE_BYTES),
                          share_box_context(s.session, s.round_index, v, victim)))
                 for v in sorted(mallory))
    header = m.decode(out[victim], expect=m.KeyList)[0]
    reply = s.clients[victim].handle(m.encode(dataclasses.replace(header, kind=m.ForwardedShares.KIND),
                                              m.ForwardedShares(fake)))
    words = s.encoder.from_bytes(m.decode(reply, expect=m.MaskedInput)[1].words, 52).copy()
    expander = MaskExpander(length=words.size, modulus_bits=s.encoder.modulus_bits)
    expander.add_into(self_mask_key(seed, s.session, s.round_index, victim), words, sign=-1)
    for v in sorted(mallory):
        key = mask_key(mallory[v][1], own.mask_key, s.session, s.round_index, victim, v)
        expander.add_into(key, words, sign=-1 if victim < v else +1)
    s.encoder.reduce(words)
    assert np.array_equal(words, s.expected_sum([victim]))

    # Authenticated (default) mode: every neighbour's entry fails its signature check.
    a = make_session(6, seed=21)
    out = advance(a, "share keys")
    replies = answers(a, {victim: out[victim]}, lambda c, msg: tampered(msg, m.KeyList, lambda b: m.KeyList(
        tuple(e if e.client == victim else dataclasses.replace(
            e, encryption_key=KeyPair.generate().public) for e in b.entries))))
    assert replies == {victim: rules.BAD_SIGNATURE}


def test_break_1_the_share_commitment_is_bound_into_the_signed_entry():
    s = make_session(6, seed=22)
    out = advance(s, "share keys")
    target = sorted(s.clients)[1]
    replies = answers(s, out, lambda c, msg: tampered(msg, m.KeyList, lambda b: m.KeyList(tuple(
        dataclasses.replace(e, commitment=bytes(32)) if e.client == target and c != target else e
        for e in b.entries))))
    assert all(replies[c] == rules.BAD_SIGNATURE for c in s.clients if c != target)


@pytest.mark.parametrize("graph,n", [("complete", 8), ("harary", 12)])
@pytest.mark.parametrize("active", [True, False])
def test_break_3_every_client_refuses_a_threshold_below_its_own_floor(graph, n, active):
    s = make_session(n, seed=23, graph=graph, active=active)
    out = advance(s, "advertise keys")
    k = s.graph.degree
    floor = minimum_threshold(n, k, 0.1, active=active, population=n)
    assert s.threshold >= floor
    low = answers(s, out, lambda c, msg: tampered(msg, m.SessionParams,
                                                  lambda b: dataclasses.replace(b, threshold=floor - 1)))
    assert set(low.values()) == {rules.UNSAFE_PARAMS}
    # The floor is the client's own: one that assumes more colluders refuses what others accept.
    s = make_session(n, seed=23, graph=graph, active=active)
    out = advance(s, "advertise keys")
    c = sorted(out)[0]
    s.clients[c]._ctx.policy = ClientPolicy(require_active=active, corrupt=0.4, population=n)
    if minimum_threshold(n, k, 0.4, active=active, population=n) > s.threshold:
        assert answers(s, {c: out[c]}, lambda c, msg: msg) == {c: rules.UNSAFE_PARAMS}


def test_break_3_the_server_and_the_config_check_use_the_clients_rule():
    s = make_session(8, seed=24)
    floor = minimum_threshold(8, s.graph.degree, 0.1, active=True, population=8)
    with pytest.raises(ValueError, match="threshold must be in"):
        MaskedServer(session=s.session, round_index=1, graph=s.graph, threshold=floor - 1,
                     encoder=s.encoder, length=50, directory={c: k.public for c, k in s.identities.items()})


def test_break_4_a_list_signed_only_by_the_neighbourhood_is_refused_on_the_harary_graph():
    """SecAgg+: the server shows a holder signatures from its own neighbours only (as it could for
    several lists at once). Fewer than the global quorum q > (n + c) / 2: the holder refuses."""
    s = make_session(14, seed=25, graph="harary", dropout=0.1)
    assert s.graph.degree < 13
    out = advance(s, "unmask")
    c = sorted(out)[0]
    local = set(s.graph.neighbours(c)) | {c}
    assert len(local) < survivor_quorum(14, 0.1, population=14)
    msg = tampered(out[c], m.UnmaskRequest, lambda b: dataclasses.replace(
        b, signatures=tuple((v, sig) for v, sig in b.signatures if v in local)))
    assert answers(s, {c: msg}, lambda c, x: x) == {c: rules.FEW_SURVIVORS}


def test_two_different_survivor_lists_can_never_both_reach_the_quorum():
    for n in range(2, 200):
        for corrupt in (0.0, 0.1, 0.2, 0.33, 0.45):
            for population in (n, 2 * n, 10 * n):  # c comes from the population, capped at n - 1
                c = corrupt_count(n, corrupt, population=population)
                q = survivor_quorum(n, corrupt, population=population)
                assert c >= min(int(corrupt * population), n - 1)
                # honest signers of two lists are disjoint: (q - c) + (q - c) must exceed n - c
                assert 2 * (q - c) > n - c and q <= n


def _survivor_without_signature(attestation_change):
    """The victim masked with exactly t partners and then fell silent (no signature on S); the
    server asks holders for its seed share with S missing one of those partners."""
    world = make_world(6, 5, active=True, corrupt=frozenset({2}))
    partners = frozenset(sorted(world.graph.neighbours(1))[: world.threshold])
    prep = prepare(world, Strategy(forward={1: partners}))
    prep.attestations[1] = attestation_change(prep.attestations[1])
    gone = max(partners - {2})
    lists = (tuple(c for c in sorted(prep.masked) if c != gone),)
    outcome = finish(prep, lists, {})
    assert outcome.aborts.pop(gone) == rules.SELF_DROPPED  # the partner called dropped signs nothing
    return outcome


def test_a_holder_refuses_a_seed_share_when_the_survivors_partners_are_not_in_the_list():
    outcome = _survivor_without_signature(lambda att: att)
    assert outcome.aborts[1] == rules.FEW_SURVIVORS  # the victim itself would not sign this S
    holders = {c for c, reason in outcome.aborts.items() if c != 1}
    assert holders and all(outcome.aborts[c] == rules.ATTESTATION for c in holders)
    assert outcome.broken == {}


def test_a_holder_refuses_a_forged_or_missing_attestation():
    flipped = _survivor_without_signature(lambda att: (bytes([att[0][0] | 0xFF]), att[1]))
    assert {r for c, r in flipped.aborts.items() if c != 1} == {rules.ATTESTATION}
    missing = _survivor_without_signature(lambda att: (att[0], bytes(64)))
    assert {r for c, r in missing.aborts.items() if c != 1} == {rules.ATTESTATION}


def test_authenticated_mode_is_the_default_everywhere():
    assert ClientPolicy().require_active
    assert MaskedAggregation(max_weight=1, rng=np.random.default_rng(0)).active
    assert SecureConfig().active
    assert MaskedClient(client_id=1, session=bytes(16), round_index=0, update=np.zeros(2), weight=1,
                        rng=np.random.default_rng(0))._ctx.policy.require_active
    s = make_session(5, seed=26)
    params = m.decode(advance(s, "advertise keys")[sorted(s.clients)[0]], expect=m.SessionParams)[1]
    assert params.active
    semi = make_session(5, seed=26, active=False)
    out = advance(semi, "advertise keys")
    c = sorted(out)[0]
    semi.clients[c]._ctx.policy = ClientPolicy()  # a client that keeps the default refuses the opt-in
    assert answers(semi, {c: out[c]}, lambda c, x: x) == {c: rules.UNSAFE_PARAMS}


def test_clients_shown_different_session_parameters_cannot_use_each_others_keys():
    """Every signature covers the digest of the parameters its signer saw: a server that shows one
    client another ring order or threshold (to change its quorum or how attestations read) splits
    it from everyone else."""
    world = make_world(6, 5, active=True)
    header, body = m.decode(world.params[3], expect=m.SessionParams)
    ring = (body.ring[1], body.ring[0]) + body.ring[2:]
    world.params[3] = m.encode(header, dataclasses.replace(body, ring=ring))
    outcome = finish(prepare(world, Strategy()), fork=False)
    assert outcome.aborts and set(outcome.aborts.values()) == {rules.BAD_SIGNATURE}
    assert set(outcome.aborts) == set(world.graph.ring)


@pytest.mark.parametrize("kwargs,name", [({"corrupt": 1.0}, "corrupt"), ({"corrupt": -0.1}, "corrupt"),
                                         ({"require_active": 1}, "require_active"),
                                         ({"max_length": 0}, "max_length"),
                                         ({"require_active": False}, "population"),
                                         ({"population": 0}, "population"),
                                         ({"population": 2.5}, "population"),
                                         ({"max_degree": 1}, "max_degree"),
                                         ({"max_ring": True}, "max_ring"),
                                         ({"clip": 0.0}, "clip"), ({"clip": float("nan")}, "clip"),
                                         ({"bits": 65}, "bits"), ({"min_word_slack": -1}, "min_word_slack")])
def test_client_policy_is_validated_and_names_the_bad_key(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ClientPolicy(**kwargs)
    with pytest.raises(TypeError):
        ClientPolicy(True)  # keyword-only
