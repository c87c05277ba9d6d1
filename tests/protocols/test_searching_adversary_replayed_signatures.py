"""Review rr9: a SEARCHING adversary that also holds survivor-list signatures from re-runs.

PASSES (= defended). test_review_rerun_same_session shows that a re-run of one (session, round,
params) gives the server honest signatures on a second list. Here the adversary is granted, on
top of the usual free lies (key lists, forwarding, any survivor lists and per-holder views, one
colluder), every signature an honest client would give in some re-run: u's signature on any list
L with u in L, |L| >= q and |N(u) ∩ L| >= t (a re-run that forwards u everything and shows it L).
The quorum is then void; the search checks the threshold t > (k + c_k)/2 and the alive-neighbour
rules alone still keep every honest input hidden (complete n = 5..7 and Harary n = 6..10).
NARROW: signatures only. Splicing KEY ENTRIES and holders across concurrent runs does read an
input (test_review_concurrent_runs_read.py); this search does not model that.
"""

import random

import pytest
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import consistency_message
from fedsec.protocols.masked.policy import survivor_quorum
from fedsec.secagg import shamir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocols.adversary import Outcome, Strategy, _broken, _send, confirmed, make_world, prepare
from tests.protocols.test_searching_adversary import random_strategy


def _finish_with_replays(prep, lists, shown):
    world, g, ring = prep.world, prep.world.graph, prep.world.graph.ring
    clients, aborts = world.clients, dict(prep.aborts)
    t, n = world.threshold, len(ring)
    q = survivor_quorum(n, 0.2, population=n)
    sigs = {i: {} for i in range(len(lists))}
    for i, lst in enumerate(lists):
        msg = consistency_message(world.session, 3, lst, params=world.digest)
        for c in ring:
            if c in world.corrupt:
                sigs[i][c] = world.identities[c].sign(msg)
            elif c in lst and len(lst) >= q and len(set(g.neighbours(c)) & set(lst)) >= t:
                sigs[i][c] = world.identities[c].sign(msg)  # what an honest c signs in a re-run
    for c in ring:  # this run's consistency stage (each honest client once)
        if c in prep.masked and c not in world.corrupt:
            _send(world, clients, c, m.ConsistencyRequest(lists[shown.get(c, 0)]), aborts)
    revealed, answered = {}, set()
    for c in ring:
        if c in world.corrupt or c not in prep.masked:
            continue
        i = shown.get(c, 0)
        lst = set(lists[i])
        holds = [v for v in g.neighbours(c) if v in prep.partners[c]]
        alive = tuple(v for v in holds if v in lst)
        dropped = tuple(v for v in holds if v not in lst)
        atts = tuple((v, *prep.attestations[v]) for v in alive
                     if v not in sigs[i] and v in prep.attestations)
        reply = _send(world, clients, c, m.UnmaskRequest(alive, dropped, tuple(sorted(sigs[i].items())),
                                                          atts), aborts)
        if reply is None:
            continue
        answered.add(c)
        for owner, kind, share in reply.shares:
            revealed.setdefault((owner, kind), {})[g.x_of(owner, c)] = share
    for c, shares in prep.held.items():
        for owner, (seed_share, key_share) in shares.items():
            x = g.x_of(owner, c)
            revealed.setdefault((owner, m.SHARE_OF_SEED), {})[x] = shamir.share_to_bytes(seed_share)
            revealed.setdefault((owner, m.SHARE_OF_MASK_KEY), {})[x] = shamir.share_to_bytes(key_share)
    return Outcome(_broken(prep, revealed), answered, aborts)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from([(5, 4), (6, 5), (7, 6), (6, 4), (8, 4), (10, 6)]), data=st.data())
def test_random_lies_with_replayed_survivor_signatures_read_nothing(shape, data):
    world = make_world(*shape, active=True, corrupt=frozenset({2}))
    strategy = data.draw(random_strategy(world))
    outcome = _finish_with_replays(prepare(world, strategy), strategy.lists, strategy.shown)
    assert confirmed(world, outcome)
    assert outcome.broken == {}


@pytest.mark.parametrize("seed", range(6))
def test_the_split_view_lie_on_harary_with_replayed_signatures_reads_nothing(seed):
    """The semi-honest break (n = 10, k = 6, one colluder), now with a void quorum in active mode."""
    rng = random.Random(seed)
    world = make_world(10, 6, active=True, corrupt=frozenset({2}))
    nb = list(world.graph.neighbours(1))
    partners = frozenset([2] + rng.sample([v for v in nb if v != 2], world.threshold - 1))
    prep = prepare(world, Strategy(forward={1: partners}))
    everyone = tuple(sorted(prep.masked))
    gone = frozenset(rng.sample(sorted(partners - {2}), rng.randint(1, len(partners) - 1)))
    lists = (everyone, tuple(c for c in everyone if c not in gone))
    shown = {c: rng.randint(0, 1) for c in world.honest}
    outcome = _finish_with_replays(prep, lists, shown)
    assert confirmed(world, outcome) and outcome.broken == {}
