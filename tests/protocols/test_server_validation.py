"""The server's own checks: share commitments (issue 9 item 7) and its validation gaps (item 9)."""

import dataclasses

import numpy as np
import pytest
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import messages as m
from fedsec.secagg import shamir

from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance, tampered


def at_unmask(n=8, seed=0, **kwargs):
    s = make_session(n, seed=seed, **kwargs)
    return s, advance(s, "unmask")


def wrong_seed_share(reply):
    """The same response with its first seed share replaced by another field element."""
    def change(body):
        (owner, kind, share), *rest = body.shares
        assert kind == m.SHARE_OF_SEED
        other = shamir.share_to_bytes((shamir.share_from_bytes(share) + 1) % shamir.PRIME)
        return m.UnmaskResponse(((owner, kind, other), *rest))

    return tampered(reply, m.UnmaskResponse, change)


@pytest.mark.parametrize("active", [True, False])
def test_a_wrong_seed_share_is_caught_its_sender_recorded_and_the_seed_rebuilt_from_the_others(active):
    s, out = at_unmask(active=active)
    liar = sorted(out)[0]
    for c, message in out.items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, wrong_seed_share(reply) if c == liar else reply)
    s.server.close()
    total, survivors = s.server.result()
    assert np.array_equal(total, s.expected_sum(survivors))
    assert "does not match its commitment" in s.server.misbehaved[liar]
    assert liar in survivors and liar not in s.server.rejected


def test_wrong_shares_leaving_fewer_than_t_good_ones_abort_never_a_wrong_sum():
    s, out = at_unmask()
    liars = sorted(out)[: len(out) - s.threshold + 1]
    for c, message in out.items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, wrong_seed_share(reply) if c in liars else reply)
    with pytest.raises(ProtocolAbort, match="share"):
        s.server.close()
    with pytest.raises(ProtocolAbort):
        s.server.result()


def test_share_commitments_that_do_not_match_the_signed_digest_remove_the_sender():
    s = make_session(6, seed=1)
    out = advance(s, "share keys")
    cheat = sorted(out)[0]
    for c, message in out.items():
        reply = s.clients[c].handle(message)
        if c == cheat:
            reply = tampered(reply, m.ShareKeys, lambda b: dataclasses.replace(
                b, commitments=bytes(len(b.commitments))))
        s.server.receive(c, reply)
    assert "commitments" in s.server.rejected[cheat]
    s.server.close()
    assert cheat not in s.server.outgoing()


def test_an_unmask_response_repeating_one_owner_and_omitting_another_is_refused_and_recorded():
    s, out = at_unmask(seed=2)
    c = sorted(out)[0]
    reply = tampered(s.clients[c].handle(out[c]), m.UnmaskResponse,
                     lambda b: m.UnmaskResponse((b.shares[0], b.shares[0], *b.shares[2:])))
    s.server.receive(c, reply)
    assert "exactly what was asked" in s.server.misbehaved[c] and c not in s.server.rejected


@pytest.mark.parametrize("bits", [12, 16], ids=["narrow-word", "full-width-word"])
def test_a_masked_word_at_or_above_the_modulus_is_rejected(bits):
    """Words are ceil(b / 8) bytes; with b = 26 they fill the uint32 and the value 2^26 still fits."""
    s = make_session(6, seed=3, bits=bits)
    out = advance(s, "masked input")
    c = sorted(out)[0]
    enc = s.encoder
    assert (enc.word_bytes == enc.dtype.itemsize) == (bits == 16) and enc.modulus_bits < 8 * enc.word_bytes

    def too_big(body):
        words = enc.from_bytes(body.words, s.updates[c].size + 2).copy()
        words[0] = 1 << enc.modulus_bits
        return dataclasses.replace(body, words=enc.to_bytes(words))

    s.server.receive(c, tampered(s.clients[c].handle(out[c]), m.MaskedInput, too_big))
    assert "modulus" in s.server.rejected[c] or "range" in s.server.rejected[c]


def test_a_client_rejected_once_is_never_in_the_sum_even_if_it_then_sends_a_valid_input():
    s = make_session(6, seed=4)
    out = advance(s, "masked input")
    c = sorted(out)[0]
    valid = s.clients[c].handle(out[c])
    s.server.receive(c, tampered(valid, m.MaskedInput, lambda b: dataclasses.replace(b, words=b"\x00")))
    s.server.receive(c, valid)
    for other, message in out.items():
        if other != c:
            s.server.receive(other, s.clients[other].handle(message))
    s.server.close()
    while not s.server.done:
        for other, message in s.server.outgoing().items():
            s.server.receive(other, s.clients[other].handle(message))
        s.server.close()
    total, survivors = s.server.result()
    assert c in s.server.rejected and c not in survivors
    assert np.array_equal(total, s.expected_sum(survivors))


def test_a_repeated_valid_message_is_noted_but_does_not_remove_or_double_count():
    s = make_session(6, seed=5)
    out = advance(s, "masked input")
    c = sorted(out)[0]
    reply = s.clients[c].handle(out[c])
    s.server.receive(c, reply)
    s.server.receive(c, reply)
    for other, message in out.items():
        if other != c:
            s.server.receive(other, s.clients[other].handle(message))
    s.server.close()
    while not s.server.done:
        for other, message in s.server.outgoing().items():
            s.server.receive(other, s.clients[other].handle(message))
        s.server.close()
    total, survivors = s.server.result()
    assert c in survivors and c not in s.server.rejected and c in s.server.misbehaved
    assert np.array_equal(total, s.expected_sum(survivors))


def test_a_wrong_mask_key_share_of_a_dropped_client_is_caught_and_the_sum_is_exact():
    s = make_session(8, seed=6, dropout=0.3)
    dropped = sorted(s.clients)[-1]
    while s.server.stage != "unmask":
        for c, message in s.server.outgoing().items():
            if not (c == dropped and s.server.stage == "masked input"):
                s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    out = s.server.outgoing()
    liar = sorted(out)[0]

    def change(body):
        return m.UnmaskResponse(tuple(
            (o, k, shamir.share_to_bytes((shamir.share_from_bytes(sh) + 7) % shamir.PRIME))
            if o == dropped else (o, k, sh) for o, k, sh in body.shares))

    for c, message in out.items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, tampered(reply, m.UnmaskResponse, change) if c == liar else reply)
    s.server.close()
    total, survivors = s.server.result()
    assert dropped not in survivors and liar in survivors
    assert np.array_equal(total, s.expected_sum(survivors))
    assert f"client {dropped}'s secret" in s.server.misbehaved[liar]
