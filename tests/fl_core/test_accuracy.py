"""The hospital scenario reaches the accuracy a centralised logistic regression gets (about 0.97)."""

import numpy as np
import pytest

from fedsec import fl_core


def _run(partition, seed, alpha=0.3):
    rng = np.random.default_rng(seed)
    data = fl_core.load_federated("breast_cancer", n_clients=4, partition=partition, alpha=alpha, rng=rng)
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=seed)
    return fl_core.FederatedServer(
        model=model, data=data,
        strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=16, lr=0.1)),
        protocol=fl_core.PlainAggregation(), rounds=30, rng=rng).run()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_breast_cancer_iid(seed):
    assert _run("iid", seed).final_accuracy >= 0.95


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_breast_cancer_dirichlet(seed):
    assert _run("dirichlet", seed).final_accuracy >= 0.93


def test_digits_cnn_learns():
    rng = np.random.default_rng(0)
    data = fl_core.load_federated("digits", n_clients=10, rng=rng)
    model = fl_core.build_model("cnn", input_shape=data.input_shape, n_classes=10, seed=0)
    result = fl_core.FederatedServer(
        model=model, data=data,
        strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=2, batch_size=10, lr=0.1)),
        protocol=fl_core.PlainAggregation(), rounds=8, fraction=0.5, rng=rng).run()
    assert result.final_accuracy >= 0.85
