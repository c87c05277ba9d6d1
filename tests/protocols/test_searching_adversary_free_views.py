"""A searching liar with two colluders and free unmask views never reads an input (from review r9).

Beyond ``tests/protocols/test_searching_adversary.py`` (one colluder, views derived from one list):
- TWO colluders (the most the clients' policy allows: corrupt fraction 0.25 at n = 8..11, or 0.2 at
  n = 10), placed next to the victim on the ring;
- per-holder unmask views that need not come from any list: alive/dropped are random subsets of
  the holder's partners, sometimes inconsistent with the list whose signatures it is shown, with
  some signatures withheld; attestations of every alive non-signer;
- up to three survivor lists (the honest one, one that drops some of the victim's partners, one
  random), each honest client shown one at the consistency check and possibly another at unmask;
- session-parameter equivocation: a random group of honest clients is sent a second, valid
  parameter set (threshold one above the floor), and the server keeps their key lists within
  their group;
- the victim masks with a random partner set of size t..k.
The harness (tests/protocols/adversary.py) recomputes every input it reports and checks it against
the victim's real encoded input. Authenticated mode: nothing is ever read.
"""

import random

import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import consistency_message
from fedsec.secagg import shamir

from tests.protocols.adversary import (
    Outcome,
    Prepared,
    Strategy,
    _broken,
    confirmed,
    make_world,
    prepare,
)

VICTIM = 1


def _ask(world, c, body, aborts):
    if c in aborts:
        return None
    data = m.encode(m.Header(0, world.session, 3, m.SERVER, c), body)
    try:
        return world.clients[c].handle(data)
    except ClientAbort as abort:
        aborts[c] = abort.reason
        return None


def _play(rng: random.Random, n: int, degree: int, corrupt: float, colluders: frozenset[int]):
    world = make_world(n, degree, active=True, corrupt=colluders, assumed_corrupt=corrupt)
    g, ring, t = world.graph, world.graph.ring, world.threshold
    honest = world.honest

    # Parameter equivocation: group 1 gets t + 1 (still a valid threshold for them).
    group = {c: 0 for c in ring}
    digests = {0: world.digest}
    if t + 1 <= degree and rng.random() < 0.4:
        body = m.decode(world.params[ring[0]], expect=m.SessionParams)[1]
        other = m.SessionParams(body.ring, body.degree, t + 1, *[getattr(body, f) for f in (
            "length", "clip", "bits", "max_clients", "max_weight", "max_length", "active",
            "word_slack")])
        digests[1] = m.params_digest(other)
        for c in honest:
            if c != VICTIM and rng.random() < 0.35:
                group[c] = 1
                world.params[c] = m.encode(m.Header(0, world.session, 3, m.SERVER, c), other)

    key_lists, forward = {}, {}
    for c in ring:
        same = [v for v in g.neighbours(c) if group[v] == group[c]]
        if rng.random() < 0.2:
            same = rng.sample(same, max(0, len(same) - rng.randint(0, 2)))
        key_lists[c] = frozenset(same)
    size = rng.randint(t, degree)
    partners = frozenset(rng.sample(list(g.neighbours(VICTIM)), size))
    forward[VICTIM] = partners
    for c in honest:
        if c != VICTIM and rng.random() < 0.3:
            forward[c] = frozenset(rng.sample(list(g.neighbours(c)), rng.randint(t, degree)))
    prep: Prepared = prepare(world, Strategy(key_lists, forward))
    aborts = dict(prep.aborts)
    everyone = tuple(sorted(prep.masked))
    cut = set(rng.sample(sorted(partners | {VICTIM}), rng.randint(1, max(1, len(partners) - 1))))
    lists = [everyone, tuple(c for c in everyone if c not in cut)]
    if rng.random() < 0.5:
        lists.append(tuple(sorted(rng.sample(ring, rng.randint(1, n)))))

    # Consistency: colluders sign every list under every parameter digest.
    sigs = {(i, d): {} for i in range(len(lists)) for d in digests}
    for (i, d) in sigs:
        for c in world.corrupt:
            sigs[(i, d)][c] = world.identities[c].sign(
                consistency_message(world.session, 3, lists[i], params=digests[d]))
    signed = {}
    for c in honest:
        if c in prep.masked:
            i = 0 if rng.random() < 0.5 else rng.randrange(len(lists))
            reply = _ask(world, c, m.ConsistencyRequest(lists[i]), aborts)
            if reply is not None:
                sigs[(i, group[c])][c] = m.decode(reply, expect=m.ConsistencySignature)[1].signature
                signed[c] = i

    revealed, answered = {}, set()
    for c in honest:
        if c not in prep.masked:
            continue
        i = signed.get(c, rng.randrange(len(lists)))
        if rng.random() < 0.15:
            i = rng.randrange(len(lists))
        lst = set(lists[i])
        holds = [v for v in g.neighbours(c) if v in prep.partners[c]]
        alive = [v for v in holds if v in lst]
        dropped = [v for v in holds if v not in lst]
        if rng.random() < 0.3:
            alive = [v for v in alive if rng.random() < 0.7]
        if rng.random() < 0.3:
            dropped = [v for v in dropped if rng.random() < 0.7]
        if rng.random() < 0.1 and alive:  # an inconsistent view
            moved = rng.choice(alive)
            alive.remove(moved)
            dropped.append(moved)
        shown = dict(sigs[(i, group[c])])
        if rng.random() < 0.2 and shown:
            del shown[rng.choice(sorted(shown))]
        atts = tuple((v, *prep.attestations[v]) for v in alive
                     if v not in shown and v in prep.attestations)
        reply = _ask(world, c, m.UnmaskRequest(tuple(alive), tuple(dropped),
                                               tuple(sorted(shown.items())), atts), aborts)
        if reply is None:
            continue
        answered.add(c)
        for owner, kind, share in m.decode(reply, expect=m.UnmaskResponse)[1].shares:
            revealed.setdefault((owner, kind), {})[g.x_of(owner, c)] = share
    for c, shares in prep.held.items():
        for owner, (seed_share, key_share) in shares.items():
            x = g.x_of(owner, c)
            revealed.setdefault((owner, m.SHARE_OF_SEED), {})[x] = shamir.share_to_bytes(seed_share)
            revealed.setdefault((owner, m.SHARE_OF_MASK_KEY), {})[x] = shamir.share_to_bytes(key_share)
    return world, Outcome(_broken(prep, revealed), answered, aborts)


SHAPES = [(8, 7, 0.25), (9, 8, 0.25), (10, 9, 0.2), (10, 6, 0.2), (10, 9, 0.25)]


@pytest.mark.parametrize("n,degree,corrupt", SHAPES, ids=[f"n{n}-k{k}-g{c}" for n, k, c in SHAPES])
def test_two_colluders_and_free_views_never_read_an_input(n, degree, corrupt):
    rng = random.Random(f"r9-{n}-{degree}")
    answered = 0
    for _ in range(20):
        world, outcome = _play(rng, n, degree, corrupt, frozenset({2, 3}))
        assert confirmed(world, outcome)
        assert outcome.broken == {}, f"read {sorted(outcome.broken)}"
        answered += len(outcome.answered_unmask)
    assert answered > 0  # the search reaches the unmask stage
