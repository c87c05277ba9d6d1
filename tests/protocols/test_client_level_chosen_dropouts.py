"""Distributed client-level noise against the server with c colluders that CHOOSES the dropouts.

Adversary: the server (it runs the round and decides who "drops out" at which stage: its own
generator schedules the dropouts) colluding with c clients, c = the corrupt count the honest
clients' threat model tolerates, min(floor(corrupt x population), n - 1). Colluders know (or
omit) their own noise shares, so what protects an honest client is the Skellam noise of the
HONEST clients in a released sum. Claim (docs/privacy.md section 4): each honest share has
variance mu / (t - c), a released sum holds >= t contributions, so >= t - c honest ones, and
the honest noise is >= mu, whatever the server chooses; t - c < 1 is refused before any draw.

The parties are the project's unmodified ``ClientLevelDP`` around ``MaskedAggregation`` (real
``MaskedServer`` / ``MaskedClient``); the adversary's only levers are its generator (which
clients drop, at which stage), the ring size n, the corrupt fraction and the threshold among
those the clients accept. The share variance is read where the clients draw it (the noise
source records each Skellam draw's variance); c is computed here from its definition, not from
the library. The colluders are placed in the worst place: all c inside the released sum.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked.graph import choose_parameters
from fedsec.protocols.masked.policy import minimum_threshold
from fedsec.protocols.privacy import ClientLevelDP
from fedsec.protocols.privacy.client_level import NoHonestMargin, distributed_round_event
from hypothesis import event, given, settings
from hypothesis import strategies as st

LENGTH = 3
Z = 1.0
MASKED_INPUT = 2  # protocols.masked.simulation: dropping "at" stage 2, a client never gets the masked input
CORRUPT = (0.0, 0.2, 0.45)


class ChosenDropouts:
    """The server's generator, scripted by the adversary: client ``c`` drops at ``plan[c]``
    (1 share keys, 2 masked input, 3 consistency check, 4 unmask); everything else it draws
    (stochastic-rounding seeds) comes from a real generator."""

    def __init__(self, plan: dict[int, int], ids: list[int]) -> None:
        self.plan, self.order, self.current = plan, iter(ids), -1
        self.real = np.random.default_rng(7)

    def integers(self, *args, **kwargs):
        return self.real.integers(*args, **kwargs)

    def random(self) -> float:
        self.current = next(self.order)
        return 0.0 if self.current in self.plan else 0.999

    def choice(self, stages):
        assert self.plan[self.current] in stages
        return self.plan[self.current]


class RecordingRandom(SecureRandom):
    """The clients' noise source; records the variance of every Skellam share drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.variances: list[float] = []

    def skellam(self, variance: float, size: int) -> np.ndarray:
        self.variances.append(variance)
        return super().skellam(variance, size)


def colluders(n: int, corrupt: float) -> int:
    """c from its definition (docs/secure-aggregation.md): floor(corrupt x population) corrupt
    clients of the population, at most n - 1 of them in a ring of n with an honest victim."""
    return min(math.floor(corrupt * n), n - 1)


def play(n: int, graph: str, active: bool, corrupt: float, threshold: int,
         plan: dict[int, int]) -> tuple[int, float, float] | None:
    """One round under the adversary's choices; (contributions released, honest noise variance
    with all c colluders in the sum, mu), or None when an honest party refused."""
    inner = MaskedAggregation(max_weight=1, rng=ChosenDropouts(plan, list(range(n))), graph=graph,
                              threshold=threshold, dropout=0.5 if plan else 0.0, tolerated_dropout=0.1,
                              tolerated_corrupt=corrupt, active=active, population=n)
    random = RecordingRandom()
    layer = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=Z, random=random)
    mu = distributed_round_event(Z, bits=inner.bits, length=LENGTH, clip_ratio=1.0).variance  # (z D2)^2
    updates = [ClientUpdate(i, np.full(LENGTH, 0.1, np.float32), 1.0) for i in range(n)]
    c = colluders(n, corrupt)
    try:
        result = layer.aggregate(1, updates)
    except NoHonestMargin:
        assert threshold - c < 1 and not random.variances  # refused before any draw
        return None
    except ProtocolAbort:
        return None
    assert threshold - c >= 1
    assert len(set(random.variances)) == 1  # every client drew one share of one variance
    share = random.variances[0]
    size = len(result.participants)
    assert size >= threshold
    return size, (size - min(c, size)) * share, mu


def accepted_configurations():
    """Every (n, graph, active, corrupt, t) with n <= 8 and t a threshold the clients accept,
    one per distinct (n, graph, active, degree, c, t)."""
    seen = set()
    for n, graph, active, corrupt in product(range(3, 9), ("complete", "harary"), (True, False), CORRUPT):
        degree = choose_parameters(n, dropout=0.1, corrupt=corrupt, graph=graph, active=active,
                                   population=n).degree
        floor = minimum_threshold(n, degree, corrupt, active=active, population=n)
        for t in range(max(floor, 2), degree + 1):
            key = (n, graph, active, degree, colluders(n, corrupt), t)
            if key not in seen:
                seen.add(key)
                yield n, graph, active, corrupt, t


def test_the_colluders_count_and_the_configurations_searched():
    configurations = list(accepted_configurations())
    assert {colluders(n, c) for n, _, _, c, _ in configurations} == {0, 1, 2, 3}
    assert len(configurations) >= 60


@pytest.mark.slow
def test_exhaustive_masked_input_withheld_near_the_floor_and_from_every_subset():
    """Every configuration above with colluders (c >= 1); the server withholds the masked-input
    request from the k last clients for k = 0 and every k from n - t - 2 up to n - t (the
    smallest sums: below n - t - 2 withheld, the sum holds >= t + 3; above n - t, fewer than t
    are left, whom the clients never unmask), and from every subset of the ring for n <= 4
    (there every k up to n). The complete graph is
    symmetric in the clients, and the Harary graph's ring order is shuffled by the OS CSPRNG,
    which the server does not control, so which k clients it picks changes nothing it gets."""
    released = sizes = 0
    for n, graph, active, corrupt, t in accepted_configurations():
        if colluders(n, corrupt) == 0:
            continue
        ks = sorted({0, *range(max(0, n - t - 2), n - t + 1)})
        plans = [{c: MASKED_INPUT for c in range(n - k, n)} for k in ks]
        if n <= 4:
            plans += [{c: MASKED_INPUT for c in range(n) if mask >> c & 1} for mask in range(1, 2**n)]
        for plan in plans:
            outcome = play(n, graph, active, corrupt, t, plan)
            if outcome is None:
                continue
            released += 1
            size, honest, mu = outcome
            sizes += size == t + 1
            assert honest >= mu * (1 - 1e-12), (n, graph, active, corrupt, t, sorted(plan), size)
    assert released >= 100 and sizes >= 10  # sums at the floor t + 1 were reached and released


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_searching_server_never_gets_a_sum_with_less_than_mu_of_honest_noise(data):
    """Hypothesis over the configuration and any dropout schedule (any clients, any stage)."""
    n, graph, active, corrupt, t = data.draw(st.sampled_from(list(accepted_configurations())))
    plan = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(1, 4), max_size=n))
    outcome = play(n, graph, active, corrupt, t, plan)
    event("refused" if outcome is None else "released")
    if outcome is not None:
        size, honest, mu = outcome
        assert honest >= mu * (1 - 1e-12), (n, graph, active, corrupt, t, plan, size)


def test_a_threshold_at_or_below_the_colluders_is_refused_before_any_draw():
    """t - c < 1: SecAgg+ (Harary graph) of 88 clients, semi-honest, corrupt 0.45: the clients
    accept t = 39 of 48 neighbours (their floor counts corrupt neighbours, a hypergeometric
    quantile), but c = 39. A typed refusal, no share drawn, nothing released."""
    n, corrupt = 88, 0.45
    degree = choose_parameters(n, dropout=0.1, corrupt=corrupt, graph="harary", active=False,
                               population=n).degree
    t = minimum_threshold(n, degree, corrupt, active=False, population=n)
    assert (degree, t, colluders(n, corrupt)) == (48, 39, 39)
    assert play(n, "harary", False, corrupt, t, {}) is None
