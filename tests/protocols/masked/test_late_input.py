"""A client given its input late (``MaskedClient(update=None, length=...)`` then ``provide``): keys,
shares and commitments do not depend on the input, so a round whose clients get their inputs only
before the masked-input stage sums exactly what the round with inputs at the start sums, with the
same seeded rounding; the masked-input stage without an input, a second input, an input of another
length or one given after the masked input are refused, typed.

Adversary: the server (it chooses when the masked-input stage comes; it cannot make a client mask
no input, or two).
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import MaskedClient
from fedsec.protocols.masked import client as rules
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance


def late_twin(s, c: int) -> MaskedClient:
    """Client ``c`` of session ``s`` rebuilt without its input (same keys, policy and seeded rounding)."""
    ctx = s.clients[c]._ctx
    return MaskedClient(client_id=c, session=s.session, round_index=s.round_index, update=None, weight=0,
                        rng=np.random.default_rng(s.seeds[c]), signing_key=ctx.signing_key,
                        directory=ctx.directory, policy=ctx.policy, length=s.updates[c].size)


def run(s, provide_at: dict[int, str]) -> tuple:
    """Run the round; client c gets its input just before the stage ``provide_at[c]``."""
    while not s.server.done:
        stage = s.server.stage
        for c, message in s.server.outgoing().items():
            if provide_at.get(c) == stage:
                s.clients[c].provide(s.updates[c], s.weights[c])
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()
    return s.server.result()


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), when=st.lists(st.sampled_from(["advertise keys", "share keys",
                                                                  "masked input"]), min_size=5, max_size=5))
def test_a_late_input_sums_what_an_input_at_the_start_sums(seed, when):
    s = make_session(5, seed=seed, active=True)
    reference = make_session(5, seed=seed, active=True)
    ids = sorted(s.clients)
    s.clients = {c: late_twin(s, c) for c in ids}
    total, survivors = run(s, dict(zip(ids, when, strict=True)))
    assert survivors == tuple(sorted(ids)) or set(survivors) == set(ids)
    assert np.array_equal(total, s.expected_sum(survivors))
    assert np.array_equal(total, reference.expected_sum(survivors))  # the same seeded rounding


def test_the_masked_input_stage_without_an_input_is_refused():
    s = make_session(5, seed=3)
    victim = sorted(s.clients)[0]
    s.clients[victim] = late_twin(s, victim)
    out = advance(s, "masked input")
    with pytest.raises(ClientAbort) as info:
        s.clients[victim].handle(out[victim])
    assert info.value.reason == rules.NO_INPUT and s.clients[victim].stage == "aborted"
    with pytest.raises(ClientAbort):  # and it stays silent, even given an input now
        s.clients[victim].provide(s.updates[victim], s.weights[victim])


@pytest.mark.parametrize("bad", ["twice", "length", "after", "given at start"])
def test_a_second_input_or_one_of_another_length_or_too_late_is_refused(bad):
    s = make_session(5, seed=4)
    victim = sorted(s.clients)[0]
    if bad != "given at start":
        s.clients[victim] = late_twin(s, victim)
    client, update, weight = s.clients[victim], s.updates[victim], s.weights[victim]
    if bad == "twice":
        client.provide(update, weight)
        attempt = (update, weight)
    elif bad == "length":
        attempt = (np.zeros(update.size + 1, np.float32), weight)
    elif bad == "after":
        client.provide(update, weight)
        out = advance(s, "masked input")
        client.handle(out[victim])
        attempt = (update, weight)
    else:
        attempt = (update, weight)
    with pytest.raises(ClientAbort) as info:
        client.provide(*attempt)
    assert info.value.reason == rules.BAD_INPUT and client.stage == "aborted"


def test_a_client_without_an_input_needs_its_length():
    s = make_session(3, seed=5)
    c = sorted(s.clients)[0]
    for length in (None, 0, True, 2.0):
        with pytest.raises(ValueError, match="length"):
            MaskedClient(client_id=c, session=s.session, round_index=s.round_index, update=None, weight=0,
                         rng=np.random.default_rng(0), length=length)
