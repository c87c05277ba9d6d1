"""The corrupt bound comes from the population, never from the ring the server chooses.

Adversary: the server, deviating arbitrarily, with up to c_pop = floor(corrupt * population)
colluding clients of the population (all of them chosen by the server). It picks which clients
are in a ring and shows a ring of its choice to any subset of clients (the signatures bind the
parameters, so groups shown different rings never meet): a small ring of the victim, the
colluders and one honest client would make a ring-based bound c = floor(corrupt * len(ring))
vanish. Each honest client derives c = min(c_pop, n - 1) from its directory (active mode) or its
policy's ``population`` (semi-honest), so its threshold floor and quorum hold in every ring.
"""

import random

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.client import ClientPolicy, MaskedClient
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.policy import minimum_threshold, survivor_quorum
from fedsec.protocols.masked.server import MaskedServer
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey

from fedsec.config import make_config
from fedsec.errors import ConfigError
from tests.protocols.adversary import LENGTH, Strategy, World, attack, confirmed

POPULATION = list(range(100, 120))
VICTIM, COLLUDERS, HONEST = 100, (101, 102), 103
IDENTITIES = {c: SigningKey.generate() for c in POPULATION}
DIRECTORY = {c: key.public for c, key in IDENTITIES.items()}


def _clients(ring, session, encoder, *, policy=None, directory=DIRECTORY):
    rng = np.random.default_rng(0)
    return {c: MaskedClient(client_id=c, session=session, round_index=1,
                            update=rng.normal(0, 0.4, encoder.max_length).astype(np.float32), weight=3,
                            rng=np.random.default_rng(c), signing_key=IDENTITIES[c], directory=directory,
                            policy=policy or ClientPolicy())
            for c in ring}


def test_the_reviewers_small_ring_is_refused_by_every_client_it_is_shown_to():
    """Review r9 finding 1: a ring of the victim, the 2 colluders the population allows and one
    honest client, with t = 2 (the floor a ring of 4 would give). Every client refuses it."""
    ring = (VICTIM, *COLLUDERS, HONEST)
    graph = RingGraph(ring, len(ring) - 1)
    lie = minimum_threshold(len(ring), graph.degree, 0.1, active=True, population=len(ring))
    floor = minimum_threshold(len(ring), graph.degree, 0.1, active=True, population=len(POPULATION))
    assert lie == 2 and floor == 3 == graph.degree
    session = bytes(range(16))
    encoder = FixedPointEncoder(clip=1.0, bits=12, max_clients=len(ring), max_weight=10, max_length=8)
    # The honest server, which knows the population, will not build it ...
    with pytest.raises(ValueError, match="threshold must be in"):
        MaskedServer(session=session, round_index=1, graph=graph, threshold=lie, encoder=encoder,
                     length=8, directory=DIRECTORY)
    # ... so the lying server does, as if its directory held only the ring.
    server = MaskedServer(session=session, round_index=1, graph=graph, threshold=lie, encoder=encoder,
                          length=8, directory={c: DIRECTORY[c] for c in ring})
    clients = _clients(ring, session, encoder)
    for c, message in server.outgoing().items():
        with pytest.raises(ClientAbort) as info:
            clients[c].handle(message)
        assert info.value.reason == rules.UNSAFE_PARAMS and clients[c].stage == "aborted"


def test_the_small_ring_at_the_population_floor_runs_and_the_colluders_hold_too_few_shares():
    ring = (VICTIM, *COLLUDERS, HONEST)
    graph = RingGraph(ring, len(ring) - 1)
    t = minimum_threshold(len(ring), graph.degree, 0.1, active=True, population=len(POPULATION))
    session = bytes(range(16, 32))
    encoder = FixedPointEncoder(clip=1.0, bits=12, max_clients=len(ring), max_weight=10, max_length=8)
    server = MaskedServer(session=session, round_index=1, graph=graph, threshold=t, encoder=encoder,
                          length=8, directory=DIRECTORY)
    clients = _clients(ring, session, encoder)
    while not server.done:
        for c, message in server.outgoing().items():
            server.receive(c, clients[c].handle(message))
        server.close()
    total, survivors = server.result()
    assert survivors == tuple(sorted(ring)) and not server.rejected
    # q = n: every client must sign; the 2 colluders hold 2 < t = 3 shares of each victim secret.
    assert survivor_quorum(4, 0.1, population=len(POPULATION)) == 4
    assert len(COLLUDERS) < t


def test_a_semi_honest_client_counts_the_population_it_is_told():
    ring = (VICTIM, *COLLUDERS, HONEST)
    graph = RingGraph(ring, len(ring) - 1)
    session = bytes(range(32, 48))
    encoder = FixedPointEncoder(clip=1.0, bits=12, max_clients=len(ring), max_weight=10, max_length=8)
    with pytest.raises(ValueError, match="population"):
        ClientPolicy(require_active=False)
    with pytest.raises(ValueError, match="population"):
        MaskedServer(session=session, round_index=1, graph=graph, threshold=2, encoder=encoder, length=8,
                     active=False)
    lie = MaskedServer(session=session, round_index=1, graph=graph, threshold=2, encoder=encoder, length=8,
                       active=False, population=4)
    outgoing = lie.outgoing()
    told = ClientPolicy(require_active=False, population=len(POPULATION))
    clients = _clients(ring, session, encoder, policy=told, directory=None)
    for c, message in outgoing.items():
        with pytest.raises(ClientAbort, match=rules.UNSAFE_PARAMS):
            clients[c].handle(message)
    # Told a population of 4, the same client accepts; a ring larger than the population is refused.
    small = _clients(ring, session, encoder, directory=None,
                     policy=ClientPolicy(require_active=False, population=4))
    assert small[VICTIM].handle(outgoing[VICTIM])
    tiny = _clients(ring, session, encoder, directory=None,
                    policy=ClientPolicy(require_active=False, population=3))
    with pytest.raises(ClientAbort, match=rules.UNSAFE_PARAMS):
        tiny[VICTIM].handle(outgoing[VICTIM])


def _world(ring, degree, t, colluders, session):
    """The harness's world on a ring the server chose from a population of 10 (ids 1..10)."""
    population = range(1, 11)
    identities = {c: SigningKey.generate() for c in ring}
    directory = {c: identities[c].public if c in identities else SigningKey.generate().public
                 for c in population}
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=10, max_weight=10, max_length=LENGTH)
    rng = np.random.default_rng(len(ring) * 100 + degree)
    updates = {c: rng.normal(0, 0.3, LENGTH).astype(np.float32) for c in ring}
    policy = ClientPolicy(corrupt=0.2)  # c_pop = 2 of the 10 enrolled
    clients = {c: MaskedClient(client_id=c, session=session, round_index=3, update=updates[c], weight=c,
                               rng=np.random.default_rng(c), signing_key=identities[c], directory=directory,
                               policy=policy) for c in ring}
    graph = RingGraph(tuple(ring), degree)
    body = m.SessionParams(graph.ring, degree, t, LENGTH, encoder.clip, encoder.bits, encoder.max_clients,
                           encoder.max_weight, encoder.max_length, True, encoder.word_slack)
    params = {c: m.encode(m.Header(0, session, 3, m.SERVER, c), body) for c in ring}
    plain = {c: encoder.encode(updates[c], c, rng=np.random.default_rng(c)).words for c in ring}
    return World(True, graph, t, frozenset(colluders), session, clients, params, identities, encoder, plain,
                 m.params_digest(body))


def test_a_search_over_rings_the_server_chooses_never_reads_the_victim():
    """Random search: a population of 10 with c_pop = 2 colluders (ids 2, 3); the server names a
    ring of the victim (1), the colluders and 0..4 other clients, any degree, any threshold from
    2 to k (below the floor included), forwards any bundles, and shows up to two survivor lists.
    Nothing is ever read; rings whose threshold the clients accept do run to unmasking."""
    rng = random.Random("population-rings")
    answered = refused = 0
    for _ in range(30):
        extra = rng.sample(range(4, 11), rng.randint(0, 4))
        ring = [1, 2, 3, *extra]
        rng.shuffle(ring)
        n = len(ring)
        degree = rng.choice([n - 1] + [k for k in range(2, n - 1, 2)])
        floor = minimum_threshold(n, degree, 0.2, active=True, population=10)
        t = rng.randint(2, degree) if rng.random() < 0.5 else min(floor, degree)
        world = _world(ring, degree, t, {2, 3}, bytes(rng.randrange(256) for _ in range(16)))
        g = world.graph
        forward = {1: frozenset(rng.sample(g.neighbours(1), rng.randint(min(t, degree), degree)))}
        survivors = tuple(sorted(ring))
        cut = tuple(c for c in survivors if c not in rng.sample(sorted(forward[1] | {1}), 1))
        lists = (survivors, cut) if rng.random() < 0.5 else (survivors,)
        shown = {c: rng.randrange(len(lists)) for c in ring}
        outcome = attack(world, Strategy(forward=forward, lists=lists, shown=shown))
        assert confirmed(world, outcome)
        assert outcome.broken == {}, (ring, degree, t, sorted(outcome.broken))
        if t < floor:
            assert set(outcome.aborts.values()) == {rules.UNSAFE_PARAMS}
            refused += 1
        answered += len(outcome.answered_unmask)
    assert refused > 0 and answered > 0


def test_the_layer_the_server_and_the_config_take_c_from_the_population():
    # MaskedAggregation: a round of 4 sampled from 20 uses the population's c = 2 (t = 3).
    layer = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), population=20)
    assert layer.parameters(4) == (3, minimum_threshold(4, 3, 0.1, active=True, population=20))
    assert MaskedAggregation(max_weight=1, rng=np.random.default_rng(0)).parameters(4) == (3, 2)
    with pytest.raises(ProtocolAbort, match="population"):
        MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), population=30).parameters(4)
    with pytest.raises(ValueError, match="population"):
        MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), population=2)
    # A round the population's colluders could fill is refused before anything runs.
    small = {"secure.aggregation": "masking", "data.dataset": "synthetic", "data.clients": 100,
             "data.samples": 2000, "train.fraction": 0.05}
    with pytest.raises(ConfigError, match="secure.corrupt: no threshold is safe for 5 clients"):
        make_config(small)
    make_config(small | {"train.fraction": 0.3})
