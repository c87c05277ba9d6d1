"""What travels to the Ray workers: each client's data once per worker, the round's vector once
per worker and round; the updates still equal the in-process ones round after round."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core import ArrayDataset, ClientTask, FedAvg, FederatedDataset, InProcessRunner, build_model
from fedsec.fl_core.local import TorchTrainer

from fedsec.backends.ray_runner import RayClientRunner, WorkerPool

pytestmark = pytest.mark.slow


def test_data_travel_once_per_worker_and_the_vector_once_a_round(ray_local):
    rng = np.random.default_rng(3)
    clients = tuple(ArrayDataset(rng.normal(size=(12, 5)).astype(np.float32),
                                 rng.integers(0, 2, 12).astype(np.int64)) for _ in range(6))
    data = FederatedDataset(name="six", clients=clients, test=clients[0], n_classes=2, input_shape=(5,),
                            standardize=False)
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=0)
    strategy = FedAvg(trainer=TorchTrainer(epochs=2, batch_size=4, lr=0.1))
    local = InProcessRunner()
    local.start(model=build_model("logreg", input_shape=(5,), n_classes=2, seed=0), strategy=strategy,
                data=data)
    runner = RayClientRunner(WorkerPool(workers=2))
    runner.start(model=model, strategy=strategy, data=data)
    size = sum(p.numel() for p in model.parameters())
    try:
        for round_index in range(3):
            # a different vector every round: a worker that trained on last round's would differ
            vector = rng.normal(size=size).astype(np.float32)
            tasks = [ClientTask(c, 100 * round_index + c) for c in range(6)]
            remote, expected = list(runner.run(vector, tasks)), list(local.run(vector, tasks))
            for got, want in zip(remote, expected, strict=True):
                np.testing.assert_array_equal(got.vector, want.vector)
                assert got.weight == want.weight and got.loss == want.loss
            if round_index == 0:
                assert runner.data_sent == 6  # each client's data went to one worker, once
            assert runner.vectors_sent == 2 * (round_index + 1)  # one per worker and round
        assert runner.data_sent <= 12  # at most once to each of the two workers
    finally:
        runner.stop()
