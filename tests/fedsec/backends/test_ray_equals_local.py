"""The Ray backend gives the local backend's history (apart from timings) for the same seed."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from fedsec.backends import ray_runner
from fedsec.config import make_config
from fedsec.experiment import build_experiment, run_experiment

pytestmark = pytest.mark.slow

BASE = {"seed": 11, "rounds": 2, "data.dataset": "digits", "data.clients": 6, "model.name": "logreg",
        "train.batch_size": 32, "secure.aggregation": "masking", "dp.mode": "dpsgd",
        "dp.noise_multiplier": 1.0, "dp.target_epsilon": 0.0, "dp.reproducible": True}
RAY = {"sim.backend": "ray"}
TIMINGS = ("seconds",)


def history(path) -> list[dict[str, str]]:
    rows = list(csv.DictReader(open(path / "history.csv")))
    for row in rows:
        for column in TIMINGS:
            row.pop(column)
    return rows


def test_masking_and_dpsgd_history_equals_local(ray_local, tmp_path):
    run_experiment(make_config(BASE), out=tmp_path / "local", audit=False)
    run_experiment(make_config({**BASE, **RAY}), out=tmp_path / "ray", audit=False)
    local, remote = history(tmp_path / "local"), history(tmp_path / "ray")
    assert len(local) == 2 and all(row["participants"] == "6" for row in local)
    assert remote == local


def test_a_mispredicted_noise_stream_is_redone_not_reused(ray_local, monkeypatch):
    """Make the driver's prediction of each client's draw wrong: the runner notices from where the
    workers' streams ended, re-runs from the first wrong one, and the model is the local one."""
    config = make_config({**BASE, "rounds": 1, "data.clients": 4, "secure.aggregation": "none"})
    reference = build_experiment(config)
    local = reference.server.run()
    monkeypatch.setattr(ray_runner, "stream_bytes", lambda trainer, n, p: 8 * n)
    experiment = build_experiment(make_config({**BASE, **RAY, "rounds": 1, "data.clients": 4,
                                               "secure.aggregation": "none"}))
    result = experiment.server.run()
    assert experiment.server.runner.redone >= 3
    np.testing.assert_array_equal(result.vector, local.vector)
    # the driver's stream goes on where the local backend's does (next round, checkpoint)
    streams = [ray_runner.find_dpsgd(e.server.strategy).optimizer.random.state_dict()
               for e in (reference, experiment)]
    assert streams[0] == streams[1] and streams[0]["offset"] > 0


def test_without_reproducible_every_client_draws_a_fresh_stream(ray_local):
    """No key travels and no two clients share noise: two clients with the same data and seed
    still send different DP-SGD updates."""
    from fedsec.dp import DPSGD
    from fedsec.fl_core import ArrayDataset, ClientTask, FedAvg, FederatedDataset, build_model
    from fedsec.protocols.privacy.trainer import DPSGDTrainer

    from fedsec.backends.ray_runner import RayClientRunner, WorkerPool

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 5)).astype(np.float32), rng.integers(0, 2, 20).astype(np.int64)
    same = ArrayDataset(x, y)
    data = FederatedDataset(name="twins", clients=(same, same), test=same, n_classes=2, input_shape=(5,),
                            standardize=False)
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=0)
    strategy = FedAvg(trainer=DPSGDTrainer(DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=5)))
    runner = RayClientRunner(WorkerPool(workers=2), reproducible=False)
    runner.start(model=model, strategy=strategy, data=data)
    try:
        vector = np.zeros(sum(p.numel() for p in model.parameters()), np.float32)
        first, second = runner.run(vector, [ClientTask(0, 5), ClientTask(1, 5)])
    finally:
        runner.stop()
    assert not np.allclose(first.vector, second.vector)
    assert len(strategy.trainer.reports) == 2


def test_cnn_model_equals_local_to_the_bit(ray_local):
    """The digits CNN (no DP, masking): every client's update, hence the model, is the local one
    bit for bit, although Ray hands each worker a copy of the client's images (canonical strides)."""
    values = {"seed": 3, "rounds": 1, "data.dataset": "digits", "data.clients": 6, "model.name": "cnn",
              "train.local_epochs": 1, "train.batch_size": 10, "secure.aggregation": "masking",
              "dp.mode": "none"}
    local = build_experiment(make_config(values)).server.run()
    remote = build_experiment(make_config({**values, **RAY})).server.run()
    assert remote.records[0].participants == 6
    np.testing.assert_array_equal(remote.vector, local.vector)


def test_runs_of_clients_give_each_client_its_own_update(ray_local):
    """Tasks that train several consecutive clients (40 clients on 2 workers: runs of 5 down to 1)
    give every client the update the local backend gives it, in the order of the tasks."""
    values = {"seed": 5, "rounds": 1, "data.dataset": "digits", "data.clients": 40, "model.name": "logreg",
              "train.batch_size": 16, "secure.aggregation": "none", "dp.mode": "none"}
    updates = {}
    for backend, extra in (("local", {}), ("ray", RAY)):
        experiment = build_experiment(make_config({**values, **extra}))
        server, seen = experiment.server, []
        inner = server.protocol.aggregate

        def record(round_index, ups, inner=inner, seen=seen, **options):
            seen.extend(ups)
            return inner(round_index, ups, **options)

        server.protocol.aggregate = record
        server.run()
        updates[backend] = seen
        if backend == "ray":
            assert 5 <= server.runner.tasks_sent < 40  # runs of more than one client were sent
    assert [u.client_id for u in updates["ray"]] == [u.client_id for u in updates["local"]]
    assert len(updates["local"]) == 40
    for local, remote in zip(updates["local"], updates["ray"], strict=True):
        np.testing.assert_array_equal(remote.vector, local.vector)
        assert remote.weight == local.weight
