"""Review r9 -- FINDING, high (fails today): the server picks the ring a client sees; c follows it.

A client's colluder bound is c = floor(corrupt * n) with n = len(ring), and the ring is whatever
the server puts in *that client's* session parameters: any subset of the directory of long-term
keys (the client only checks ``ring <= directory``). Nothing ties it to the round's real size.

Round of 20 clients (the directory: the ids of this round, as ``MaskedAggregation`` builds it),
default corrupt fraction 0.1, so the docs allow floor(0.1 * 20) = 2 colluders. The server sends
the victim, the two colluders and one honest client parameters naming a ring of just those four
(the other 16 get the real parameters, or nothing: the signatures bind the parameters, so the two
groups never meet -- the docs' "n, and so q, is the same for all of them" holds only *within* a
group). In the 4-ring every client computes c = floor(0.4) = 0, accepts t = 2 and q = 3, and the
two colluders alone hold t shares of every secret of the victim (seed and mask key). The round
completes with no abort and the server reads the victim's exact encoded input, with an honest
client present. The same holds with a population-wide directory and per-round sampling (fedsec
samples a fraction C of the clients each round, chosen by the server).

Fix direction: the client must derive c (and so t and q) from something the server cannot shrink
-- the directory / the round's announced population -- e.g. c = floor(corrupt * len(directory)),
or refuse a ring smaller than the population it was told to expect.
"""

import numpy as np

from protocols.masked import messages as m
from protocols.masked.client import ClientPolicy, MaskedClient
from protocols.masked.graph import RingGraph
from protocols.masked.keys import mask_key, self_mask_key
from protocols.masked.policy import minimum_threshold
from protocols.masked.server import MaskedServer
from secagg import shamir
from secagg.encoding import FixedPointEncoder
from secagg.keys import KeyPair, SigningKey
from secagg.prg import MaskExpander

POPULATION = list(range(100, 120))
VICTIM, COLLUDERS, HONEST = 100, (101, 102), 103
LENGTH = 8


def test_a_ring_built_around_the_victim_lets_population_colluders_read_its_input():
    identities = {c: SigningKey.generate() for c in POPULATION}
    directory = {c: identities[c].public for c in POPULATION}
    assert int(0.1 * len(POPULATION)) == len(COLLUDERS)  # the population's allowance

    ring = (VICTIM, *COLLUDERS, HONEST)
    graph = RingGraph(ring, len(ring) - 1)
    t = minimum_threshold(len(ring), graph.degree, 0.1, active=True)
    session = bytes(range(16))
    encoder = FixedPointEncoder(clip=1.0, bits=12, max_clients=len(ring), max_weight=10,
                                max_length=LENGTH)
    rng = np.random.default_rng(0)
    updates = {c: rng.normal(0, 0.4, LENGTH).astype(np.float32) for c in ring}
    server = MaskedServer(session=session, round_index=1, graph=graph, threshold=t, encoder=encoder,
                          length=LENGTH, directory=directory)
    clients = {c: MaskedClient(client_id=c, session=session, round_index=1, update=updates[c],
                               weight=3, rng=np.random.default_rng(c), signing_key=identities[c],
                               directory=directory, policy=ClientPolicy())
               for c in ring}

    masked, entries = {}, {}
    while not server.done:
        stage = server.stage
        for c, message in server.outgoing().items():
            reply = clients[c].handle(message)  # no honest client aborts
            if stage == "advertise keys":
                entries[c] = m.decode(reply, expect=m.AdvertiseKeys)[1].entry
            if stage == "masked input":
                masked[c] = encoder.from_bytes(m.decode(reply, expect=m.MaskedInput)[1].words,
                                               LENGTH + 2)
            server.receive(c, reply)
        if stage == "masked input":
            # The colluders' own holdings: their shares of the victim's seed and mask key.
            held = [(graph.x_of(VICTIM, c), clients[c]._ctx.received[VICTIM]) for c in COLLUDERS]
        server.close()
    assert server.done and not server.rejected

    # Only the colluders' state and the victim's masked input are used from here on.
    xs = tuple(x for x, _ in held)
    assert len(xs) >= t
    seed = shamir.combine_one(xs[:t], [shamir.share_to_bytes(s[0]) for _, s in held[:t]])
    victim_key = KeyPair.from_private(
        shamir.combine_one(xs[:t], [shamir.share_to_bytes(s[1]) for _, s in held[:t]]))
    words = masked[VICTIM].copy()
    expander = MaskExpander(length=LENGTH + 2, modulus_bits=encoder.modulus_bits)
    expander.add_into(self_mask_key(seed, session, 1, VICTIM), words, sign=-1)
    for w in (w for w in ring if w != VICTIM):  # the honest server forwarded every bundle
        key = mask_key(victim_key, entries[w].mask_key, session, 1, VICTIM, w)
        expander.add_into(key, words, sign=-1 if VICTIM < w else +1)
    encoder.reduce(words)
    truth = encoder.encode(updates[VICTIM], 3, rng=np.random.default_rng(VICTIM)).words

    # The server reads the victim's exact encoded input (while an honest client 103 is in the ring).
    read_it = np.array_equal(words, truth)
    assert not read_it, (
        "a ring of 4 chosen by the server from a directory of 20 (2 colluders allowed for the "
        f"population) gets t = {t} from every client, and the 2 colluders read the victim's input")
