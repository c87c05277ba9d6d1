"""Item 8 of issue 9 and review r9 findings 2 and 3: a session naming a huge ring costs a client
memory linear in the message and work on its own neighbourhood only; a degree above the client's
``max_degree`` (a ring above ``max_ring``) is refused before any work; survivor lists of 2^16 ids
and more are signed, never a ``struct.error``.

Adversary: a lying server that sends a 10^6-member ring (complete or sparse graph). Before the
fix a client built every member's neighbour set (n x k entries: quadratic for the complete graph,
about 1 GB for k = 10 here). Asserted on the sizes of what is built, never on time.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import RingGraph, shuffled_ring
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.client import ClientPolicy, MaskedClient
from fedsec.protocols.masked.keys import consistency_message, key_message
from fedsec.protocols.masked.policy import minimum_threshold
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.keys import KeyPair, SigningKey, context_bytes, verify
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocols.helpers import make_session

N = 10**6


def _client(ring, me, session, *, directory=None, signing_key=None):
    """An honest client with the default policy (active mode required, corrupt = 0.1)."""
    return MaskedClient(client_id=me, session=session, round_index=1, update=np.zeros(4), weight=1,
                        rng=np.random.default_rng(0), signing_key=signing_key, directory=directory)


def test_a_million_member_sparse_ring_costs_a_client_little():
    """Active mode, as the default client insists: every member is in the client's directory,
    and t is the default client's floor for k = 40 (34 for corrupt = 0.1 at n = 10^6)."""
    ring = tuple(range(10, 10 + N))
    me, session, k = ring[N - 3], os.urandom(16), 40
    t = minimum_threshold(N, k, ClientPolicy().corrupt, active=True, population=N)
    assert t <= k
    p = ring.index(me)
    neighbours = [ring[(p + o) % N] for o in (*range(1, k // 2 + 1), *range(-(k // 2), 0))]
    identities = {c: SigningKey.generate() for c in (me, *neighbours)}
    # Members this client never hears from share one real verification key: generating 10^6
    # Ed25519 keys would take a minute, and only its neighbours' keys are ever used.
    others = SigningKey.generate().public
    directory = dict.fromkeys(ring, others) | {c: key.public for c, key in identities.items()}
    client = _client(ring, me, session, directory=directory, signing_key=identities[me])
    session_params = m.SessionParams(ring, k, t, 4, 1.0, 12, N, 100, 4, True)
    params = m.encode(m.Header(0, session, 1, m.SERVER, me), session_params)
    digest = m.params_digest(session_params)

    def entry(v):
        encryption, masking = KeyPair.generate().public, KeyPair.generate().public
        commitment = os.urandom(32)
        signature = identities[v].sign(key_message(session, 1, v, encryption, masking, commitment,
                                                   params=digest))
        return m.KeyEntry(v, encryption, masking, commitment, signature)

    entries = [entry(v) for v in neighbours]
    tracemalloc.start()
    try:
        advert = m.decode(client.handle(params), expect=m.AdvertiseKeys)[1]
        reply = client.handle(m.encode(m.Header(0, session, 1, m.SERVER, me),
                                       m.KeyList((advert.entry, *entries))))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    shares = m.decode(reply, expect=m.ShareKeys)[1]
    assert sorted(v for v, _ in shares.sealed) == sorted(neighbours)
    # The parsed ring itself (Python ints) is ~5x the message; the graph adds 2 x 8 bytes a member.
    assert peak < 10 * len(params)  # the old client built n x k entries: ~130x at k = 10
    graph = client._ctx.graph
    assert list(graph._by_owner) == [me] and len(graph._by_owner[me][0]) == k


def test_a_million_member_complete_ring_builds_no_per_member_structure():
    """The lying server names a 10^6-member complete ring with t = n/2 + 1, below the default
    client's floor (0.55 n for corrupt = 0.1): the client refuses, and what it built to read the
    ring before refusing is linear in the message. (A threshold it accepted would cost it the
    O(t k) Shamir sharing of the protocol itself: docs/secure-aggregation-robustness.md.)"""
    ring = tuple(range(5, 5 + N))
    me, session = ring[17], os.urandom(16)
    signing_key = SigningKey.generate()
    client = _client(ring, me, session, directory=dict.fromkeys(ring, signing_key.public),
                     signing_key=signing_key)
    assert minimum_threshold(N, N - 1, ClientPolicy().corrupt, active=True, population=N) > N // 2 + 1
    params = m.encode(m.Header(0, session, 1, m.SERVER, me),
                      m.SessionParams(ring, N - 1, N // 2 + 1, 4, 1.0, 12, N, 100, 4, True))
    tracemalloc.start()
    try:
        with pytest.raises(ClientAbort, match="unsafe or invalid session parameters"):
            client.handle(params)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * len(params) and client.stage == "aborted"
    # The structure the client reads the ring into, as it builds it: nothing per member until
    # a neighbourhood is asked for.
    graph = RingGraph(m.decode(params, expect=m.SessionParams)[1].ring, N - 1)
    assert graph._by_owner == {} and me in graph
    assert graph._ids.nbytes + graph._slots.nbytes == 16 * N
    assert graph.x_of(me, ring[18]) == 1 and graph.x_of(me, ring[16]) == N - 1
    assert list(graph._by_owner) == [me]  # its own neighbourhood only (n - 1 = k members)


@settings(max_examples=30)
@given(n=st.integers(3, 40), data=st.data())
def test_arithmetic_neighbourhoods_match_the_definition(n, data):
    k = data.draw(st.sampled_from([n - 1] + list(range(2, n - 1, 2))))
    ids = data.draw(st.lists(st.integers(0, 2**64 - 2), min_size=n, max_size=n, unique=True))
    graph = RingGraph(shuffled_ring(ids), k)
    u = data.draw(st.sampled_from(ids))
    p, half = graph.ring.index(u), k // 2
    offsets = range(1, n) if k == n - 1 else [*range(1, half + 1), *range(-half, 0)]
    assert graph.neighbours(u) == tuple(graph.ring[(p + o) % n] for o in offsets)
    assert graph.position(u) == p and u in graph
    stranger = data.draw(st.integers(0, 2**64 - 1).filter(lambda x: x not in ids))
    assert stranger not in graph and graph.x_of(u, stranger) == 0 and graph.x_of(stranger, u) == 0
    assert not graph.is_neighbour(stranger, u)
    with pytest.raises(KeyError):
        graph.neighbours(stranger)


@pytest.mark.parametrize("ring", [(1, -2, 3), (1, True, 3), (1, 2**64, 3), (1, 2.0, 3), (1, "2", 3)])
def test_rings_with_ids_that_are_not_u64_integers_are_refused(ring):
    with pytest.raises(InvalidArgumentError):
        RingGraph(ring, 2)


def test_a_complete_ring_of_2_20_is_refused_before_any_work():
    """Review r9 finding 2: one parameters message naming a complete ring of 2^20 (t at the floor)
    would cost O(t k) = 2^40 Shamir operations. The default policy's max_degree (1024) refuses it
    with UNSAFE_PARAMS before the client builds its graph or draws a secret."""
    n = 1 << 20
    ring = tuple(range(n))
    me = SigningKey.generate()
    directory = dict.fromkeys(ring, SigningKey.generate().public) | {0: me.public}
    t = minimum_threshold(n, n - 1, 0.1, active=True, population=n)
    session = os.urandom(16)
    client = _client(ring, 0, session, directory=directory, signing_key=me)
    data = m.encode(m.Header(0, session, 1, m.SERVER, 0), m.SessionParams(ring, n - 1, t, 4, 1.0, 8, n, 1,
                                                                         4, True, 0))
    with pytest.raises(ClientAbort, match="unsafe or invalid session parameters"):
        client.handle(data)
    ctx = client._ctx
    assert client.stage == "aborted" and ctx.graph is None and ctx.shares is None and ctx.seed == b""


@pytest.mark.parametrize("field,policy", [("degree", {"max_degree": 8}), ("ring", {"max_ring": 12})])
def test_a_policy_bounds_the_degree_and_the_ring_it_accepts(field, policy):
    s = make_session(13, seed=31, graph="complete")
    params = m.decode(s.server.outgoing()[sorted(s.clients)[0]], expect=m.SessionParams)[1]
    assert params.degree == 12 and len(params.ring) == 13
    out = s.server.outgoing()
    for c in s.clients:
        s.clients[c]._ctx.policy = ClientPolicy(**policy)
    for c, message in out.items():
        with pytest.raises(ClientAbort, match="unsafe or invalid session parameters"):
            s.clients[c].handle(message)


def test_a_survivor_list_of_65536_ids_is_signed_not_a_crash():
    """Review r9 finding 3: the signed survivor statement counts ids with 32 bits. Ring 0..65535 on
    the Harary graph at the clients' floor; the victim (0) and every client within 18 ring
    positions are real clients; the consistency request lists the whole ring. The victim signs,
    and the statement the server verifies (the same function) checks out."""
    n, k, session = 65_536, 18, bytes(16)
    ring = tuple(range(n))
    graph = RingGraph(ring, k)
    t = minimum_threshold(n, k, 0.1, active=True, population=n)
    real = [p % n for p in range(-k, k + 1)]
    identities = {c: SigningKey.generate() for c in real}
    directory = dict.fromkeys(ring, SigningKey.generate().public) | {c: identities[c].public for c in real}
    params = m.SessionParams(ring, k, t, 4, 1.0, 8, n, 1, 4, True, 0)

    def message(c, body):
        return m.encode(m.Header(0, session, 2, m.SERVER, c), body)

    clients = {c: MaskedClient(client_id=c, session=session, round_index=2, update=np.zeros(4, np.float32),
                               weight=1, rng=np.random.default_rng(c), signing_key=identities[c],
                               directory=directory) for c in real}
    entries = {c: m.decode(clients[c].handle(message(c, params)), expect=m.AdvertiseKeys)[1].entry
               for c in real}
    sealed = {}
    for c in real:
        shown = (entries[c],) + tuple(entries[v] for v in graph.neighbours(c) if v in entries)
        try:
            sealed[c] = dict(m.decode(clients[c].handle(message(c, m.KeyList(shown))),
                                      expect=m.ShareKeys)[1].sealed)
        except ClientAbort:
            continue  # the outermost real clients lack t real neighbours
    victim = 0
    clients[victim].handle(message(victim, m.ForwardedShares(
        tuple((v, sealed[v][victim]) for v in graph.neighbours(victim)))))
    reply = clients[victim].handle(message(victim, m.ConsistencyRequest(ring)))
    signature = m.decode(reply, expect=m.ConsistencySignature)[1].signature
    verify(identities[victim].public, signature,
           consistency_message(session, 2, ring, params=m.params_digest(params)))
    with pytest.raises(InvalidArgumentError):  # the 16-bit context refuses, typed, never struct.error
        context_bytes(session, 2, *ring)
