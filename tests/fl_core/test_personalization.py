"""Ditto's personal models at the two ends of lam, and Per-FedAvg's step against a hand computation."""

import math

import numpy as np
import pytest
from fedsec.fl_core import FedAvg, FederatedServer, PlainAggregation, SGDTrainer, build_model, load_federated
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.parameters import get_vector, set_vector
from fedsec.fl_core.personalization import (
    Ditto,
    PerFedAvg,
    adapt,
    per_client_accuracy,
    prox_sgd,
    split_local,
)


def _run(strategy, rounds, *, seed=3, clients=3):
    rng = np.random.default_rng(seed)
    data = load_federated("breast_cancer", n_clients=clients, partition="dirichlet", rng=rng, alpha=0.5)
    model = build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=7)
    start = get_vector(model)
    server = FederatedServer(model=model, data=data, strategy=strategy, protocol=PlainAggregation(),
                             rounds=rounds, rng=rng)
    result = server.run()
    return server, result, start


def _fedavg():
    return FedAvg(trainer=SGDTrainer(epochs=1, batch_size=16, lr=0.1))


def test_ditto_leaves_the_global_model_exactly_fedavgs():
    ditto = Ditto(inner=_fedavg(), lam=0.5, lr=0.05, epochs=2, batch_size=8)
    _, with_ditto, _ = _run(ditto, 3)
    _, alone, _ = _run(_fedavg(), 3)
    np.testing.assert_array_equal(with_ditto.vector, alone.vector)


def test_lam_infinite_gives_every_client_the_fedavg_model_and_large_lam_approaches_it():
    rounds = 4
    _, before_last, _ = _run(_fedavg(), rounds - 1)  # the global model of the last round
    server, _, _ = _run(Ditto(inner=_fedavg(), lam=math.inf, lr=0.05), rounds)
    near_server, _, _ = _run(Ditto(inner=_fedavg(), lam=1e6, lr=0.05), rounds)
    for k in range(3):
        personal = server.strategy.personal_vector(server.data.clients[k])
        np.testing.assert_array_equal(personal, before_last.vector)
        near = near_server.strategy.personal_vector(near_server.data.clients[k])
        np.testing.assert_allclose(near, before_last.vector, atol=1e-4)


def test_lam_zero_is_local_training_from_the_initial_model():
    rounds, epochs = 3, 2
    server, _, start = _run(Ditto(inner=_fedavg(), lam=0.0, lr=0.05, epochs=epochs), rounds)
    model = build_model("logreg", input_shape=(30,), n_classes=2, seed=0)
    for k in range(3):
        set_vector(model, start)
        SGDTrainer(epochs=rounds * epochs, batch_size=0, lr=0.05).train(
            model, server.data.clients[k], rng=np.random.default_rng(0))
        np.testing.assert_allclose(server.strategy.personal_vector(server.data.clients[k]),
                                   get_vector(model), atol=1e-5)


def test_prox_sgd_is_the_closed_form_prox_step():
    x = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=np.float32)
    data = ArrayDataset(x, np.array([1, 0, 1]))
    model = build_model("logreg", input_shape=(2,), n_classes=2, seed=0)
    start = np.array([0.2, -0.1, 0.05], dtype=np.float32)
    anchor = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    lam, lr = 3.0, 0.1
    v = prox_sgd(model, start, anchor, data, lam=lam, lr=lr, epochs=1, batch_size=0,
                 rng=np.random.default_rng(0))
    w, b = start[:2].astype(np.float64), float(start[2])
    p = 1 / (1 + np.exp(-(x @ w + b)))
    grad = np.concatenate([x.T @ (p - [1, 0, 1]) / 3, [np.mean(p - [1, 0, 1])]])
    expected = (start - lr * grad + lr * lam * anchor) / (1 + lr * lam)
    np.testing.assert_allclose(v, expected, atol=1e-6)


def _logistic_grad(theta, x, y):
    w, b = theta[:-1], theta[-1]
    p = 1 / (1 + np.exp(-(x @ w + b)))
    return np.concatenate([x.T @ (p - y) / len(y), [np.mean(p - y)]])


@pytest.mark.parametrize("batch_size,steps", [(0, 1), (2, 3)])
def test_per_fedavg_first_order_update_by_hand(batch_size, steps):
    x = np.array([[0.5, -1.0], [1.5, 0.3], [-0.7, 0.8], [0.1, 0.1], [2.0, -0.4]], dtype=np.float32)
    y = np.array([1, 0, 1, 0, 1])
    data = ArrayDataset(x, y)
    model = build_model("logreg", input_shape=(2,), n_classes=2, seed=1)
    w = np.array([0.3, -0.2, 0.1], dtype=np.float32)
    alpha, beta = 0.4, 0.25
    strategy = PerFedAvg(alpha=alpha, beta=beta, local_steps=steps, batch_size=batch_size)
    result = strategy.client_update(model, w, data, rng=np.random.default_rng(11))
    rng = np.random.default_rng(11)
    theta, xs = w.astype(np.float64), x.astype(np.float64)

    def draw():
        if batch_size == 0:
            return np.arange(5)
        return np.sort(rng.choice(5, size=batch_size, replace=False))

    for _ in range(steps):
        d, d2 = draw(), draw()
        inner = theta - alpha * _logistic_grad(theta, xs[d], y[d])
        theta = theta - beta * _logistic_grad(inner, xs[d2], y[d2])
    np.testing.assert_allclose(result.vector, theta - w, atol=1e-6)
    assert result.weight == 5.0
    np.testing.assert_allclose(strategy.apply(w, result.vector), theta, atol=1e-6)
    adapted = adapt(model, w, data, alpha=alpha, steps=1, rng=np.random.default_rng(0))
    np.testing.assert_allclose(adapted, w - alpha * _logistic_grad(w.astype(np.float64), xs, y),
                               atol=1e-6)


def test_per_fedavg_adaptation_helps_on_a_non_iid_split():
    strategy = PerFedAvg(alpha=0.05, beta=0.05, local_steps=5, batch_size=16)
    server, result, _ = _run(strategy, 5, clients=4)
    tests = server.data.clients  # the clients' own data: adaptation fits them
    before = per_client_accuracy(server.model, [result.vector] * 4, tests)
    after = per_client_accuracy(server.model, [
        adapt(server.model, result.vector, c, alpha=0.05, steps=5, rng=np.random.default_rng(0))
        for c in tests], tests)
    assert after.mean() >= before.mean()


def test_split_local_holds_out_disjoint_stratified_parts():
    rng = np.random.default_rng(0)
    data = load_federated("breast_cancer", n_clients=4, partition="dirichlet", rng=rng, alpha=0.5)
    train, tests = split_local(data, holdout=0.25, rng=rng)
    for full, part, test in zip(data.clients, train.clients, tests):
        assert len(part) + len(test) == len(full) and len(test) >= 1
        rows = {r.tobytes() for r in full.x}
        assert {r.tobytes() for r in part.x} | {r.tobytes() for r in test.x} <= rows
    with pytest.raises(InvalidParameterError):
        split_local(data, holdout=1.0, rng=rng)


def test_bad_arguments_raise():
    for kwargs in ({"lam": -1.0, "lr": 0.1}, {"lam": 1.0, "lr": 0.0}, {"lam": 1.0, "lr": 0.1,
                                                                        "epochs": 0}):
        with pytest.raises(InvalidParameterError):
            Ditto(inner=_fedavg(), **kwargs)
    with pytest.raises(InvalidParameterError):
        PerFedAvg(alpha=0.1, beta=-1.0, local_steps=1, batch_size=0)
    with pytest.raises(InvalidParameterError):
        PerFedAvg(alpha=0.1, beta=0.1, local_steps=0, batch_size=0)
