"""Every client abort rule, and a lying server that every honest client refuses."""

import dataclasses

import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.secagg.keys import KeyPair

from tests.protocols.helpers import make_session


def advance(s, stage):
    """Run the round with every client answering until the server is at ``stage``."""
    while s.server.stage != stage:
        for c, message in s.server.outgoing().items():
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    return s.server.outgoing()


def tampered(message, expect, change):
    header, body = m.decode(message, expect=expect)
    return m.encode(header, change(body))


def refuses(s, client, message, reason):
    with pytest.raises(ClientAbort) as info:
        s.clients[client].handle(message)
    assert info.value.reason == reason
    assert s.clients[client].stage == "aborted"
    with pytest.raises(ClientAbort):  # and stays silent afterwards
        s.clients[client].handle(message)


@pytest.fixture
def key_stage():
    s = make_session(8, seed=1)
    out = advance(s, "share keys")
    victim = sorted(out)[0]
    return s, out, victim


def test_own_key_missing(key_stage):
    s, out, c = key_stage
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(tuple(e for e in b.entries if e.client != c)))
    refuses(s, c, msg, rules.OWN_KEY)


def test_own_key_altered(key_stage):
    s, out, c = key_stage
    fake = KeyPair.generate().public
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(tuple(
        dataclasses.replace(e, mask_key=fake) if e.client == c else e for e in b.entries)))
    refuses(s, c, msg, rules.OWN_KEY)


def test_own_key_duplicated_under_another_client(key_stage):
    s, out, c = key_stage
    mine = next(e for e in m.decode(out[c], expect=m.KeyList)[1].entries if e.client == c)
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(tuple(
        dataclasses.replace(e, encryption_key=mine.encryption_key, mask_key=mine.mask_key)
        if e.client != c and e is b.entries[-1] else e for e in b.entries)))
    refuses(s, c, msg, rules.DUPLICATE_KEYS)


def test_duplicate_client_entries(key_stage):
    s, out, c = key_stage
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(b.entries + (b.entries[-1],)))
    refuses(s, c, msg, rules.DUPLICATE_KEYS)


def test_duplicate_keys_of_two_neighbours(key_stage):
    s, out, c = key_stage
    others = [e for e in m.decode(out[c], expect=m.KeyList)[1].entries if e.client != c]
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(tuple(
        dataclasses.replace(e, mask_key=others[0].mask_key) if e.client == others[1].client else e
        for e in b.entries)))
    refuses(s, c, msg, rules.DUPLICATE_KEYS)


def test_fewer_than_t_neighbours_in_the_key_list(key_stage):
    s, out, c = key_stage
    def keep_few(b):
        own = tuple(e for e in b.entries if e.client == c)
        return m.KeyList(own + tuple(e for e in b.entries if e.client != c)[: s.threshold - 1])

    msg = tampered(out[c], m.KeyList, keep_few)
    refuses(s, c, msg, rules.FEW_NEIGHBOURS)


def test_key_list_naming_a_stranger(key_stage):
    s, out, c = key_stage
    stranger = m.KeyEntry(99_999, KeyPair.generate().public, KeyPair.generate().public, b"h" * 32,
                          b"z" * 64)
    msg = tampered(out[c], m.KeyList, lambda b: m.KeyList(b.entries + (stranger,)))
    refuses(s, c, msg, rules.UNKNOWN_CLIENT)


@pytest.fixture
def share_stage():
    s = make_session(8, seed=2)
    out = advance(s, "masked input")
    return s, out, sorted(out)[0]


def test_share_ciphertext_that_fails_authentication(share_stage):
    s, out, c = share_stage

    def flip(body):
        (v, blob), *rest = body.sealed
        return m.ForwardedShares(((v, blob[:-1] + bytes([blob[-1] ^ 1])), *rest))

    refuses(s, c, tampered(out[c], m.ForwardedShares, flip), rules.SHARE_AUTH)


def test_share_bundle_relabelled_to_another_sender(share_stage):
    s, out, c = share_stage

    def swap(body):
        (v1, b1), (v2, b2), *rest = body.sealed
        return m.ForwardedShares(((v1, b2), (v2, b1), *rest))

    refuses(s, c, tampered(out[c], m.ForwardedShares, swap), rules.SHARE_AUTH)


def test_fewer_than_t_forwarded_shares(share_stage):
    s, out, c = share_stage
    msg = tampered(out[c], m.ForwardedShares, lambda b: m.ForwardedShares(b.sealed[: s.threshold - 1]))
    refuses(s, c, msg, rules.FEW_NEIGHBOURS)


@pytest.fixture
def unmask_stage():
    s = make_session(8, seed=3, dropout=0.3)
    dropped = sorted(s.clients)[-1]
    while s.server.stage != "unmask":
        for c, message in s.server.outgoing().items():
            if c == dropped and s.server.stage == "masked input":
                continue
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    out = s.server.outgoing()
    return s, out, sorted(out)[0], dropped


def test_unmask_request_with_a_client_both_alive_and_dropped(unmask_stage):
    s, out, c, _ = unmask_stage
    msg = tampered(out[c], m.UnmaskRequest,
                   lambda b: dataclasses.replace(b, dropped=b.dropped + (b.alive[0],)))
    refuses(s, c, msg, rules.BOTH_LISTS)


def test_unmask_request_naming_a_client_never_in_the_round(unmask_stage):
    s, out, c, _ = unmask_stage
    msg = tampered(out[c], m.UnmaskRequest, lambda b: dataclasses.replace(b, dropped=b.dropped + (123_456,)))
    refuses(s, c, msg, rules.UNKNOWN_CLIENT)


def test_unmask_request_listing_the_client_itself_as_dropped(unmask_stage):
    s, out, c, _ = unmask_stage
    msg = tampered(out[c], m.UnmaskRequest, lambda b: dataclasses.replace(b, dropped=b.dropped + (c,)))
    refuses(s, c, msg, rules.SELF_DROPPED)


def test_unmask_request_with_too_few_survivors(unmask_stage):
    s, out, c, _ = unmask_stage
    msg = tampered(out[c], m.UnmaskRequest, lambda b: dataclasses.replace(
        b, alive=b.alive[: s.threshold - 1], dropped=b.dropped + b.alive[s.threshold - 1:]))
    refuses(s, c, msg, rules.FEW_SURVIVORS)


def test_honest_unmask_request_is_answered(unmask_stage):
    s, out, c, dropped = unmask_stage
    reply = s.clients[c].handle(out[c])
    _, body = m.decode(reply, expect=m.UnmaskResponse)
    kinds = {owner: kind for owner, kind, _ in body.shares}
    assert kinds[dropped] == m.SHARE_OF_MASK_KEY
    assert all(kind == m.SHARE_OF_SEED for owner, kind in kinds.items() if owner != dropped)


@pytest.mark.parametrize("field,value", [("session", b"x" * 16), ("round", 8)])
def test_message_from_another_session_or_round(field, value):
    s = make_session(5, seed=5)
    out = advance(s, "advertise keys")
    c = sorted(out)[0]
    header, body = m.decode(out[c], expect=m.SessionParams)
    refuses(s, c, m.encode(dataclasses.replace(header, **{field: value}), body), rules.REPLAY)


def test_garbage_and_wrong_kind_are_refused():
    s = make_session(5, seed=6)
    c = sorted(s.clients)[0]
    refuses(s, c, b"\x00garbage", rules.MALFORMED)
    s = make_session(5, seed=6)
    out = advance(s, "share keys")
    refuses(s, c, out[c][:-3], rules.MALFORMED)


def test_unsafe_threshold_is_refused():
    s = make_session(6, seed=7)
    out = advance(s, "advertise keys")
    c = sorted(out)[0]
    msg = tampered(out[c], m.SessionParams, lambda b: dataclasses.replace(b, threshold=1))
    refuses(s, c, msg, rules.UNSAFE_PARAMS)
