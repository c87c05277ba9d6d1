"""What travels to the Ray workers: each client's data once per worker, the round's vector once
per worker and round; the updates still equal the in-process ones round after round."""

from __future__ import annotations

import numpy as np
import pytest
import ray
from fedsec.fl_core import (
    ArrayDataset,
    ClientFailure,
    ClientTask,
    FedAvg,
    FederatedDataset,
    InProcessRunner,
    build_model,
)
from fedsec.fl_core.local import TorchTrainer

from fedsec.backends.ray_runner import MissingInput, RayClientRunner, WorkerPool

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


def test_a_worker_missing_its_inputs_loses_those_clients_then_gets_everything_again(ray_local):
    """If a worker lacks data the runner believes it sent (the task that carried it failed before
    running), the clients of the runs that needed it drop out as lost, not crash the round, and
    what is sent next carries everything again and trains to the in-process bits."""
    rng = np.random.default_rng(5)
    clients = tuple(ArrayDataset(rng.normal(size=(8, 5)).astype(np.float32),
                                 rng.integers(0, 2, 8).astype(np.int64)) for _ in range(4))
    data = FederatedDataset(name="four", clients=clients, test=clients[0], n_classes=2, input_shape=(5,),
                            standardize=False)
    strategy = FedAvg(trainer=TorchTrainer(epochs=1, batch_size=4, lr=0.1))
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=0)
    local = InProcessRunner()
    local.start(model=build_model("logreg", input_shape=(5,), n_classes=2, seed=0), strategy=strategy,
                data=data)
    runner = RayClientRunner(WorkerPool(workers=1))
    runner.start(model=model, strategy=strategy, data=data)
    runner.chunk = 1
    vector = np.zeros(sum(p.numel() for p in model.parameters()), np.float32)
    tasks = [ClientTask(c, c) for c in range(4)]
    try:
        (actor,) = runner.pool.actors()
        runner._sent[id(actor)] = (actor, {0, 1, 2, 3}, None)  # believes the worker holds all data
        first = list(runner.run(vector, tasks))
        expected = list(local.run(vector, tasks))
        # the two runs queued on the worker at once both lack their data: lost; the runner then
        # forgets what it believed, and the next runs carry their data and train as in-process
        assert [o.reason for o in first[:2]] == ["lost: MissingInput"] * 2
        assert all(isinstance(o, ClientFailure) for o in first[:2])
        for got, want in zip(first[2:], expected[2:], strict=True):
            np.testing.assert_array_equal(got.vector, want.vector)
        second = list(runner.run(vector, tasks))
        for got, want in zip(second, expected, strict=True):
            np.testing.assert_array_equal(got.vector, want.vector)
        # a task of a later round that comes without a vector never trains from an older one
        with pytest.raises(MissingInput):
            ray.get(actor.update_many.remote(runner._round + 1, None, [0], [0], [None], []))
    finally:
        runner.stop()


def test_tasks_take_a_share_of_the_clients_left_and_the_workers_count_their_calls(ray_local):
    """Each task takes 1 / (depth x workers) of the clients not yet sent (at least one): 20 clients
    on 2 workers with 2 tasks queued each go as runs of 5, 3, 3, 2, 1, ... (11 tasks, not 20);
    every task is one counted call of a worker, with some CPU inside it and no more than the
    worker process used in all."""
    rng = np.random.default_rng(7)
    clients = tuple(ArrayDataset(rng.normal(size=(6, 5)).astype(np.float32),
                                 rng.integers(0, 2, 6).astype(np.int64)) for _ in range(20))
    data = FederatedDataset(name="twenty", clients=clients, test=clients[0], n_classes=2, input_shape=(5,),
                            standardize=False)
    strategy = FedAvg(trainer=TorchTrainer(epochs=1, batch_size=3, lr=0.1))
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=0)
    runner = RayClientRunner(WorkerPool(workers=2))
    runner.start(model=model, strategy=strategy, data=data)
    vector = np.zeros(sum(p.numel() for p in model.parameters()), np.float32)
    try:
        outcomes = list(runner.run(vector, [ClientTask(c, c) for c in range(20)]))
        assert all(not isinstance(o, ClientFailure) for o in outcomes)
        # left 20, 15, 12, 9, 7, 6, 5, 4, 3, 2, 1: runs of 5, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1
        assert runner.tasks_sent == 11
        stats = runner.pool.stats()
        assert len(stats) == 2
        assert sum(calls for calls, _, _ in stats) == 11
        for calls, inside, process in stats:
            assert calls >= 1 and 0 < inside <= process
    finally:
        runner.stop()
