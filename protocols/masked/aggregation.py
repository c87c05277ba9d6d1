"""Pairwise-mask secure aggregation behind the ``fl_core`` seam (simulation, in memory).

Each call runs one full protocol round among the given clients: every client encodes its update
with the shared fixed-point encoder, masks it, and the server learns only the weighted sum of
the survivors' updates, their total weight and their total clipped-value count.

What the seam does with bad input (see :func:`protocols.encoding.validate_updates`): an update
with a bad id, a repeated id, a vector that is not a finite 1-D real array, a weight that is not
an integer in [1, max_weight], or a length other than the common one is rejected: listed in
``dropped``, counted in ``metrics['rejected']`` and in :attr:`MaskedAggregation.last_rejected`
with its reason; the round goes on with the others. A client the server removes during the round
before its masked input is in the total (e.g. for a small-order key) is recorded the same way:
``rejected`` counts only clients that are not in the sum. A survivor that misbehaves after its
masked input is in the total (a malformed consistency signature or unmask answer, a share that
does not match its commitment) cannot leave the sum: it stays in ``participants``, is counted in
``metrics['misbehaved']`` and listed in :attr:`MaskedAggregation.last_misbehaved`. A round that
cannot release the exact sum raises :class:`protocols.errors.ProtocolAbort`, never another exception.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from fedsec.fl_core.aggregation import (
    AggregateResult,
    AggregationProtocol,
    ClientUpdate,
    Purpose,
)
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols.encoding import (
    Rejection,
    ShiftedNoise,
    check_layer_arguments,
    encoder_for,
    remove_offsets,
    validate_updates,
)
from fedsec.protocols.errors import MalformedMessage, ProtocolAbort
from fedsec.protocols.masked.client import ClientPolicy
from fedsec.protocols.masked.graph import choose_parameters
from fedsec.protocols.masked.policy import corrupt_count, minimum_threshold
from fedsec.protocols.masked.simulation import (
    DROP_STAGES,
    ClientExecutor,
    RoundTrace,
    build_round,
    run_round,
)
from fedsec.protocols.masked.workers import check_workers
from fedsec.protocols.transport import InMemoryTransport
from fedsec.secagg.errors import SecAggError
from fedsec.secagg.keys import SigningKey


class MaskedAggregation(AggregationProtocol):
    """SecAgg (complete graph) or SecAgg+ (Harary graph) as an aggregation protocol.

    Args:
        max_weight: largest client weight n_k (a public bound), >= 1; weights must be integers.
        clip: update coordinates are clipped to [-clip, clip] before encoding, > 0.
        bits: quantisation bits per coordinate, in [1, 32].
        graph: ``complete`` or ``harary``.
        threshold: t; 0 chooses it by the documented rule of :mod:`protocols.masked.graph`.
        dropout: simulated dropout fraction in [0, 1): each client drops, with this probability, at
            a stage drawn uniformly from keys/shares/masked input/unmask.
        tolerated_dropout: dropout fraction the graph rule provisions for (default: max(0.1, 2 x
            dropout), capped below 1).
        tolerated_corrupt: fraction of the population assumed to collude with the server, in [0, 1).
        population: the enrolled clients (the federation size), >= 3; the corrupt bound is
            floor(tolerated_corrupt * population), capped by the round's size, whoever is sampled.
            None: the valid clients of each call (right only when every client takes part in
            every round).
        active: authenticated mode (default): signed keys, attestations and survivor list, against a
            lying server. False is the semi-honest opt-in (a server that follows the protocol).
        reproducible: draw the ring order from ``rng`` too, so identical runs give identical
            rounds (experiments only: whoever knows the seed knows the ring).
        rng: the run's generator (dropout draws and stochastic rounding; never cryptography).
        workers: processes computing the server's unmask stage, its own included, in [1, 64]
            (:class:`~protocols.masked.server.MaskedServer`); 1 (default): the server's process
            alone; the sum is the same bit for bit either way.
    """

    name = "masking"

    def __init__(self, *, max_weight: int, rng: np.random.Generator, clip: float = 1.0, bits: int = 16,
                 graph: str = "complete", threshold: int = 0, dropout: float = 0.0,
                 tolerated_dropout: float | None = None, tolerated_corrupt: float = 0.1,
                 active: bool = True, reproducible: bool = False, population: int | None = None,
                 workers: int = 1) -> None:
        check_layer_arguments(max_weight=max_weight, clip=clip, bits=bits, dropout=dropout)
        if graph not in ("complete", "harary"):
            raise InvalidParameterError(f"graph must be 'complete' or 'harary', got {graph!r}")
        if threshold < 0 or threshold == 1:
            raise InvalidParameterError(f"threshold must be 0 (automatic) or >= 2, got {threshold}")
        if not 0 <= tolerated_corrupt < 1:
            raise InvalidParameterError(f"tolerated_corrupt must be in [0, 1), got {tolerated_corrupt}")
        self.max_weight, self.clip, self.bits, self.graph = max_weight, float(clip), bits, graph
        self.threshold, self.dropout, self.active = threshold, dropout, active
        self.reproducible = reproducible
        self.tolerated_dropout = (min(max(0.1, 2 * dropout), 0.9) if tolerated_dropout is None
                                  else tolerated_dropout)
        if not 0 <= self.tolerated_dropout < 1:
            raise InvalidParameterError(f"tolerated_dropout must be in [0, 1), got {tolerated_dropout}")
        self.tolerated_corrupt = tolerated_corrupt
        if population is not None and (isinstance(population, bool) or not isinstance(population, int)
                                       or population < 3):
            raise InvalidParameterError(f"population must be None or an integer >= 3, got {population!r}")
        self.population = population
        try:
            self.workers = check_workers(workers)
        except ValueError as error:
            raise InvalidParameterError(str(error)) from None
        self.rng = rng
        self.client_noise: ShiftedNoise | None = None
        """Shifted integer noise every client adds to its encoded update (client-level DP)."""
        self._identities: dict[int, SigningKey] = {}
        self.last_trace: RoundTrace | None = None
        self.last_rejected: list[Rejection] = []
        """Updates refused at the seam and clients the server removed in the last call, with why
        (none of them is in the sum)."""
        self.last_misbehaved: dict[int, str] = {}
        """Survivors of the last call that misbehaved after their masked input was in the total
        (they are in the sum), with why."""
        self.client_executor: ClientExecutor | None = None
        """Where the honest clients compute (:mod:`protocols.masked.simulation`); None = here, one
        after another. A round whose clients add noise (``client_noise``) always runs here: the
        noise comes from one stream in the clients' order."""

    def min_contributions(self, n: int) -> int:
        """The fewest inputs a released sum over n sampled clients can hold (the threshold)."""
        return self.parameters(n)[1]

    def tolerated_colluders(self, n: int) -> int:
        """c: the clients of a round of n that may collude with the server, the count the clients'
        threshold floor is derived for (:func:`protocols.masked.policy.corrupt_count`)."""
        return corrupt_count(n, self.tolerated_corrupt, population=self.population_for(n))

    def parameters(self, n: int) -> tuple[int, int]:
        """(degree, threshold) this protocol uses for n clients; ProtocolAbort below 3 clients
        (a threshold t >= 2 needs k >= 2 neighbours)."""
        if n < 3:
            raise ProtocolAbort(f"masking needs at least 3 valid clients (a threshold >= 2 of their "
                                f"neighbours), got {n}")
        population = self.population_for(n)
        chosen = choose_parameters(n, dropout=self.tolerated_dropout, corrupt=self.tolerated_corrupt,
                                   graph=self.graph, active=self.active, population=population)
        threshold = self.threshold or chosen.threshold
        floor = minimum_threshold(n, chosen.degree, self.tolerated_corrupt, active=self.active,
                                  population=population)
        if not floor <= threshold <= chosen.degree:
            raise ProtocolAbort(f"threshold {threshold} is outside [{floor}, {chosen.degree}] for {n} "
                                f"clients (the clients' floor for corrupt fraction "
                                f"{self.tolerated_corrupt} of a population of {population})")
        return chosen.degree, threshold

    def population_for(self, n: int) -> int:
        """The population the corrupt fraction is taken of in a round of n valid clients."""
        if self.population is None:
            return n
        if n > self.population:
            raise ProtocolAbort(f"{n} clients in a round of a population of {self.population}")
        return self.population

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        valid, rejected = validate_updates(updates, self.max_weight)
        self.last_rejected = list(rejected)
        n = len(valid)
        degree, threshold = self.parameters(n)
        noise = self.client_noise if purpose == "update" else None
        encoder = encoder_for(purpose, clients=n, length=int(valid[0].vector.size),
                              max_weight=self.max_weight, clip=self.clip, bits=self.bits, noise=noise)
        ids = [u.client_id for u in valid]
        identities = None
        if self.active:
            for c in ids:
                self._identities.setdefault(c, SigningKey.generate())
            identities = {c: self._identities[c] for c in ids}
        built = build_round(
            updates={u.client_id: u.vector for u in valid},
            weights={u.client_id: int(u.weight) for u in valid},
            rngs={c: np.random.default_rng(self.rng.integers(0, 2**63 - 1)) for c in ids},
            encoder=encoder, degree=degree, threshold=threshold, round_index=round_index,
            identities=identities, active=self.active, corrupt=self.tolerated_corrupt,
            population=self.population_for(n), noise=noise.draw if noise else None,
            ring_rng=self.rng if self.reproducible else None,
            policy=ClientPolicy(require_active=self.active, corrupt=self.tolerated_corrupt,
                                population=self.population_for(n), clip=encoder.clip, bits=encoder.bits,
                                min_word_slack=noise.slack if noise else 0),
            server_workers=self.workers)
        server, clients = built.server, built.clients
        drops = {}
        if self.dropout > 0:
            for c in ids:
                if self.rng.random() < self.dropout:
                    drops[c] = int(self.rng.choice(DROP_STAGES))
        transport = InMemoryTransport()
        calls = (self.client_executor.open(built.specs)
                 if self.client_executor is not None and noise is None else None)
        try:
            self.last_trace = run_round(server, clients, drop_at=drops, transport=transport, calls=calls)
            total, survivors = server.result()
        except (SecAggError, MalformedMessage) as error:
            # Defence in depth: every peer-caused failure is already typed inside the protocol;
            # anything of ours that still escapes ends the round as an abort, never a crash.
            raise ProtocolAbort(f"masked round failed: {type(error).__name__}") from None
        finally:
            if calls is not None:
                calls.close()
            self.last_rejected = rejected + [Rejection(c, why) for c, why in server.rejected.items()]
            self.last_misbehaved = server.misbehaved
        weighted, total_weight, clipped = encoder.decode(
            remove_offsets(total, len(survivors), noise))
        in_sum = set(survivors)
        dropped = [r.client_id for r in rejected] + [c for c in ids if c not in in_sum]
        return AggregateResult(
            weighted_sum=weighted,
            total_weight=float(total_weight),
            participants=survivors,
            dropped=tuple(dropped),
            upload_bytes=transport.upload_bytes,
            metrics={"clipped": float(clipped), "rejected": float(len(self.last_rejected)),
                     "misbehaved": float(len(self.last_misbehaved)),
                     "client_aborts": float(len(self.last_trace.aborts)),
                     "secagg_degree": float(degree), "secagg_threshold": float(threshold),
                     **({"lost_clients": float(len(self.last_trace.lost))} if self.last_trace.lost else {})},
        )
