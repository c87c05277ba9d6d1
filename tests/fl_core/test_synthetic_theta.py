"""The federated estimate of theta reaches the centralised maximum-likelihood one."""

import numpy as np
import pytest
from fedsec.fl_core.centralized import logistic_mle
from fedsec.fl_core.standardize import linear_in_raw_units

from fedsec import fl_core


def test_logistic_mle_zeroes_the_score():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4))
    y = (rng.random(2000) < 1 / (1 + np.exp(-(0.5 + x @ [1.0, -2.0, 0.0, 0.5])))).astype(int)
    b, theta = logistic_mle(x, y)
    p = 1 / (1 + np.exp(-(b + x @ theta)))
    assert np.abs(np.hstack([np.ones((2000, 1)), x]).T @ (y - p)).max() < 1e-8
    assert np.allclose(theta, [1.0, -2.0, 0.0, 0.5], atol=0.2)


def test_linear_in_raw_units_is_the_same_function():
    rng = np.random.default_rng(1)
    mean, std, w = rng.normal(size=3), rng.uniform(0.5, 2, size=3), rng.normal(size=3)
    x = rng.normal(size=(10, 3))
    b, theta = linear_in_raw_units(w, 0.7, mean, std)
    np.testing.assert_allclose(b + x @ theta, 0.7 + ((x - mean) / std) @ w, rtol=1e-12)


@pytest.mark.parametrize("setup", [1, 2, 3, 4])
def test_fedavg_full_batch_converges_to_the_central_estimate(setup):
    data = fl_core.load_federated("synthetic", n_clients=5, synthetic_setup=setup,
                                  synthetic_samples=3000, synthetic_features=6,
                                  rng=np.random.default_rng(setup))
    pooled = data.pooled()
    b_c, theta_c = logistic_mle(pooled.x, pooled.y)
    central = np.concatenate([[b_c], theta_c])
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=0)
    server = fl_core.FederatedServer(
        model=model, data=data,
        strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=0, lr=2.0)),
        protocol=fl_core.PlainAggregation(), rounds=300, rng=np.random.default_rng(0))
    result = server.run()
    info = server.data.info
    b_f, theta_f = linear_in_raw_units(result.vector[:-1], result.vector[-1], info["feature_mean"],
                                       info["feature_std"])
    federated = np.concatenate([[b_f], theta_f])
    assert np.linalg.norm(federated - central) / np.linalg.norm(central) < 0.01
