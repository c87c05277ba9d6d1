"""Review r9 -- FINDING (fails today): a survivor list of 65,536 ids crashes an honest client with struct.error.

The signed survivor statement (``keys.consistency_message``) packs the list through
``secagg.keys.context_bytes``, whose party count is a 16-bit field (``struct.pack('>H', ...)``).
The wire and docs/secure-aggregation-robustness.md accept rings of up to 2^20 ids ("Session
parameters naming a ring of up to 2^20 ids ... the client builds no per-member structure"), and the
consistency request may name up to q..n of them. With n >= 65,536 the honest client's
``_AwaitConsistency`` raises ``struct.error`` out of ``MaskedClient.handle`` instead of a
``ClientAbort`` (and the honest ``MaskedServer._Consistency.accept`` computes the same statement,
so an honest authenticated round of >= 65,536 survivors crashes the server too).

Setting: ring 0..65535 on the Harary graph with the clients' own floor (k = 18, t = 18, default
corrupt fraction 0.1); the victim (id 0) and every client within 18 ring positions are real,
unmodified ``MaskedClient``s; the server relays honestly up to the consistency request, which lists
the whole ring (>= the quorum, every partner of the victim in it).
"""

import numpy as np

from protocols.errors import ClientAbort
from protocols.masked import messages as m
from protocols.masked.client import ClientPolicy, MaskedClient
from protocols.masked.graph import RingGraph
from protocols.masked.policy import minimum_threshold
from secagg.encoding import FixedPointEncoder
from secagg.keys import SigningKey

N = 65_536
K = 18
SESSION = bytes(16)


def _message(c, body):
    return m.encode(m.Header(0, SESSION, 2, m.SERVER, c), body)


def test_a_survivor_list_of_65536_ids_is_a_client_abort_not_a_crash():
    ring = tuple(range(N))
    graph = RingGraph(ring, K)
    t = minimum_threshold(N, K, 0.1, active=True)
    assert t <= K
    real = [p % N for p in range(-K, K + 1)]
    identities = {c: SigningKey.generate() for c in real}
    dummy = SigningKey.generate().public
    directory = {c: identities[c].public if c in identities else dummy for c in ring}
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=N, max_weight=1, max_length=4)
    params = m.SessionParams(ring, K, t, 4, encoder.clip, encoder.bits, encoder.max_clients,
                             encoder.max_weight, encoder.max_length, True, encoder.word_slack)
    clients = {c: MaskedClient(client_id=c, session=SESSION, round_index=2,
                               update=np.zeros(4, np.float32), weight=1,
                               rng=np.random.default_rng(c), signing_key=identities[c],
                               directory=directory, policy=ClientPolicy()) for c in real}
    entries = {c: m.decode(clients[c].handle(_message(c, params)), expect=m.AdvertiseKeys)[1].entry
               for c in real}
    sealed = {}
    for c in real:
        shown = (entries[c],) + tuple(entries[v] for v in graph.neighbours(c) if v in entries)
        try:
            reply = clients[c].handle(_message(c, m.KeyList(shown)))
        except ClientAbort:
            continue  # the outermost real clients lack t real neighbours
        sealed[c] = dict(m.decode(reply, expect=m.ShareKeys)[1].sealed)
    victim = 0
    bundles = tuple((v, sealed[v][victim]) for v in graph.neighbours(victim))
    clients[victim].handle(_message(victim, m.ForwardedShares(bundles)))
    try:
        reply = clients[victim].handle(_message(victim, m.ConsistencyRequest(ring)))
    except ClientAbort:
        return  # a documented outcome
    assert m.decode(reply, expect=m.ConsistencySignature)
