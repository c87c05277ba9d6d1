"""Searching the fail-stop adversary of an executor: lose any set of up to half the clients
before any stage of a masking round. The honest server releases the exact sum of a set of clients
that holds every client it never lost and no client lost before its masked input whenever every
survivor keeps at least t of its neighbours, and aborts with ProtocolAbort otherwise; nothing
else (no wrong sum, no other exception).

The loss goes through the same path as a dead Ray worker (``Handled(lost=...)`` from the
executor), with the project's unmodified server and clients, in this process (fast)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fedsec.fl_core import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked.simulation import ClientCalls, ClientExecutor, Handled, LocalCalls

N = 5
STAGES = {True: 5, False: 4}  # params, key list, shares (masked input), [consistency,] unmask


class LoseBefore(ClientExecutor):
    """Runs the clients here and loses ``victims`` from the ``stage``-th message on."""

    def __init__(self, victims: frozenset[int], stage: int) -> None:
        self.victims, self.stage = victims, stage

    def open(self, specs):
        return _Losing({c: s.build() for c, s in specs.items()}, self.victims, self.stage)


class _Losing(ClientCalls):
    def __init__(self, clients, victims, stage):
        self.local, self.victims, self.stage, self.seen = LocalCalls(clients), victims, stage, 0

    def handle(self, messages):
        self.seen += 1
        kept = [(c, m) for c, m in messages if self.seen < self.stage or c not in self.victims]
        answers = dict(self.local.handle(kept))
        for client_id, _ in messages:
            yield client_id, answers.get(client_id, Handled(lost="lost: worker died"))


UPDATES = [ClientUpdate(c, np.random.default_rng(c).uniform(-0.5, 0.5, 20).astype(np.float32),
                        float(c + 1)) for c in range(N)]
VICTIMS = [frozenset(v) for k in range(1, N // 2 + 1) for v in itertools.combinations(range(N), k)]


@pytest.mark.parametrize("active", [True, False])
def test_every_loss_pattern_gives_an_exact_sum_or_a_clean_abort(active):
    released = aborted = 0
    threshold = MaskedAggregation(max_weight=N, rng=np.random.default_rng(1), active=active,
                                  tolerated_dropout=0.5, population=N).parameters(N)[1]
    cases = [(victims, stage) for victims in VICTIMS for stage in range(1, STAGES[active] + 1)]
    for victims, stage in cases:
        layer = MaskedAggregation(max_weight=N, rng=np.random.default_rng(1), active=active,
                                  tolerated_dropout=0.5, population=N)
        layer.client_executor = LoseBefore(victims, stage)
        try:
            result = layer.aggregate(1, UPDATES)
        except ProtocolAbort:
            aborted += 1
            assert N - len(victims) - 1 < threshold, (victims, stage)
            continue
        released += 1
        assert N - len(victims) - 1 >= threshold, (victims, stage)
        inside = set(result.participants)
        assert set(range(N)) - victims <= inside, (victims, stage)
        if stage <= 3:  # lost before sending its masked input: never in the sum
            assert not inside & victims, (victims, stage)
        assert result.metrics["lost_clients"] == len(victims)
        chosen = [u for u in UPDATES if u.client_id in inside]
        assert result.total_weight == sum(u.weight for u in chosen)
        expected = sum(u.weight * u.vector.astype(np.float64) for u in chosen)
        np.testing.assert_allclose(result.weighted_sum, expected, atol=N * N * 2.0 ** -14)
    # released exactly when every survivor keeps t neighbours among the survivors (t = 3 of 4)
    assert released == N * STAGES[active] and aborted == len(cases) - released
