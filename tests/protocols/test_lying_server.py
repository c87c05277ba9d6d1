"""A server that lies: every honest client refuses, and no sum or secret leaks through them."""

import dataclasses

from protocols.errors import ClientAbort
from protocols.masked import client as rules
from protocols.masked import messages as m
from secagg.keys import KeyPair
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
    assert first in s.server.rejected  # an honest server sees the signature is over another list
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
