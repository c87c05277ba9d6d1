"""A worker killed mid-round is a dropout: the round completes with the others."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import ray
from fedsec.fl_core import ClientUpdate
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked.simulation import ClientCalls, ClientExecutor

from fedsec.backends.ray_runner import RayClientExecutor, WorkerPool
from fedsec.config import make_config
from fedsec.experiment import build_experiment

pytestmark = pytest.mark.slow


class KillOnce:
    """A local trainer that kills its own worker process the first time it trains on data of
    ``victim_size`` samples (a marker file makes it once per test), else trains as ``inner``."""

    def __init__(self, inner, victim_size: int, marker: str) -> None:
        self.inner, self.victim_size, self.marker = inner, victim_size, marker

    def train(self, model, data, *, rng):
        if len(data) == self.victim_size and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.train(model, data, rng=rng)


def test_a_training_worker_killed_mid_round_is_a_dropout(ray_local, tmp_path):
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))
    config = make_config({"seed": 2, "rounds": 2, "data.dataset": "breast_cancer", "data.clients": 5,
                          "data.partition": "unbalanced", "secure.aggregation": "masking",
                          "dp.mode": "none", "sim.backend": "ray"})
    experiment = build_experiment(config)
    server = experiment.server
    sizes = [len(c) for c in experiment.data.clients]
    victim = max(set(sizes), key=sizes.index)  # a size only one client has
    assert sizes.count(victim) == 1
    server.strategy.trainer = KillOnce(server.strategy.trainer, victim, str(tmp_path / "killed"))
    server.runner.depth = server.runner.chunk = 1  # one client a task, none queued: it alone is lost
    result = server.run()
    first, second = result.records
    assert (tmp_path / "killed").exists()
    assert first.status == "ok" and first.metrics["failed_clients"] == 1
    assert first.participants == 4 and first.dropped == 1
    assert second.status == "ok" and second.participants == 5  # a fresh worker took its place


class KillBeforeStage(ClientExecutor):
    """Delegates to the Ray executor and SIGKILLs one worker's process just before the clients
    handle their ``stage``-th message of the round (the honest parties are the project's own)."""

    def __init__(self, inner: RayClientExecutor, stage: int) -> None:
        self.inner, self.stage = inner, stage

    def open(self, specs):
        return _Killing(self.inner.open(specs), self.inner.pool, self.stage)


class _Killing(ClientCalls):
    def __init__(self, calls, pool, stage):
        self.calls, self.pool, self.stage, self.seen = calls, pool, stage, 0

    def handle(self, messages):
        self.seen += 1
        if self.seen == self.stage:
            os.kill(ray.get(self.pool.actors()[0].pid.remote()), signal.SIGKILL)
        return self.calls.handle(messages)

    def close(self):
        self.calls.close()


def test_a_masking_worker_killed_mid_round_drops_its_clients(ray_local):
    """The worker dies after its clients shared their keys, before they send their masked inputs:
    the survivors reveal the lost clients' mask-key shares and the server releases the exact sum
    of the survivors."""
    pool = WorkerPool(workers=3, cpus_per_worker=0.5)
    rng = np.random.default_rng(7)
    layer = MaskedAggregation(max_weight=10, rng=rng, tolerated_dropout=0.5, population=9)
    layer.client_executor = KillBeforeStage(RayClientExecutor(pool), 3)
    updates = [ClientUpdate(c, rng.uniform(-0.5, 0.5, 50).astype(np.float32), float(c + 1))
               for c in range(9)]
    try:
        result = layer.aggregate(1, updates)
    finally:
        pool.shutdown()
    lost = {0, 3, 6}  # the clients hosted on worker 0 (spread evenly: client i on worker i % 3)
    assert set(result.participants) == set(range(9)) - lost and set(result.dropped) == lost
    assert result.metrics["lost_clients"] == 3 and result.metrics["client_aborts"] == 0
    survivors = [u for u in updates if u.client_id not in lost]
    expected = sum(u.weight * u.vector.astype(np.float64) for u in survivors)
    assert result.total_weight == sum(u.weight for u in survivors)
    np.testing.assert_allclose(result.weighted_sum, expected, atol=10 * 9 * 2.0 ** -14)
