import numpy as np
from fedsec.fl_core.standardize import apply_standardization, federated_moments

from fedsec import fl_core


def test_federated_moments_equal_the_pooled_statistics():
    data = fl_core.load_federated("breast_cancer", n_clients=5, partition="dirichlet", alpha=0.3,
                                  rng=np.random.default_rng(0))
    mean, std, upload = federated_moments(data, fl_core.PlainAggregation())
    pooled = data.pooled().x.astype(np.float64)
    np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(std, pooled.std(axis=0), rtol=1e-3)
    assert upload == 2 * 5 * (30 * 4 + 8)
    scaled = apply_standardization(data, mean, std)
    z = scaled.pooled().x
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-3)
    np.testing.assert_allclose(z.std(axis=0), 1, atol=1e-3)
    # The test split is scaled with the training statistics, not its own.
    np.testing.assert_allclose(scaled.test.x, (data.test.x - mean) / std, rtol=1e-4, atol=1e-5)


def test_constant_feature_keeps_unit_scale():
    clients = tuple(fl_core.ArrayDataset(np.array([[1.0, k], [1.0, k + 1]], np.float32),
                                         np.array([0, 1])) for k in range(3))
    data = fl_core.FederatedDataset("t", clients, clients[0], 2, (2,), standardize=True)
    mean, std, _ = federated_moments(data, fl_core.PlainAggregation())
    assert std[0] == 1.0 and mean[0] == 1.0
