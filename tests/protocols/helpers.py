"""Build one masked round (server + honest clients) for tests."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from fedsec.protocols.masked import MaskedClient, MaskedServer, RingGraph, choose_parameters, workers
from fedsec.protocols.masked.simulation import build_round
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey


@dataclass
class Session:
    server: MaskedServer
    clients: dict[int, MaskedClient]
    encoder: FixedPointEncoder
    updates: dict[int, np.ndarray]
    weights: dict[int, int]
    seeds: dict[int, int]
    graph: RingGraph
    threshold: int
    session: bytes
    round_index: int
    identities: dict[int, SigningKey]

    def expected_sum(self, survivors) -> np.ndarray:
        """The plain sum of the survivors' encoded inputs, mod 2^b."""
        total = np.zeros(self.updates[survivors[0]].size + 2, dtype=object)
        for c in survivors:
            words = self.encoder.encode(self.updates[c], self.weights[c],
                                        rng=np.random.default_rng(self.seeds[c])).words
            total = total + words.astype(object)
        return (total % (1 << self.encoder.modulus_bits)).astype(self.encoder.dtype)


def make_session(n: int = 6, *, length: int = 50, graph: str = "complete", active: bool = True,
                 threshold: int | None = None, round_index: int = 7, seed: int = 0,
                 dropout: float = 0.2, corrupt: float = 0.1, bits: int = 12) -> Session:
    """A fresh round of n honest clients; active (authenticated) mode unless ``active=False``."""
    rng = np.random.default_rng(seed)
    ids = [int(x) for x in rng.choice(10_000, size=n, replace=False)]
    params = choose_parameters(n, dropout=dropout, corrupt=corrupt, graph=graph, active=active)
    t = threshold or params.threshold
    encoder = FixedPointEncoder(clip=1.0, bits=bits, max_clients=n, max_weight=100, max_length=length)
    identities = {c: SigningKey.generate() for c in ids}
    updates = {c: rng.normal(0, 0.5, length).astype(np.float32) for c in ids}
    weights = {c: int(rng.integers(1, 101)) for c in ids}
    seeds = {c: int(rng.integers(0, 2**32)) for c in ids}
    built = build_round(updates=updates, weights=weights,
                        rngs={c: np.random.default_rng(seeds[c]) for c in ids}, encoder=encoder,
                        degree=params.degree, threshold=t, round_index=round_index,
                        identities=identities if active else None, active=active, corrupt=corrupt)
    return Session(built.server, built.clients, encoder, updates, weights, seeds, built.graph, t,
                   built.session, round_index, identities)


@contextlib.contextmanager
def stopped_worker() -> Iterator[workers.WorkerPool]:
    """A fresh two-process pool (``workers.shared_pool(2)``) whose one worker process is stopped
    (SIGSTOP) for the block: it neither dies nor answers. Killed and the pools closed after."""
    workers.close_pools()
    pool = workers.shared_pool(2)
    (pid,) = pool.warm()
    try:
        os.kill(pid, signal.SIGSTOP)
        yield pool
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        workers.close_pools()
