import numpy as np
import pytest
from fedsec.fl_core import InvalidParameterError, load_federated
from fedsec.fl_core.synthetic import SENSOR_CLIENT, SENSOR_FEATURE, random_correlation


def test_breast_cancer_split_is_disjoint_and_stratified():
    data = load_federated("breast_cancer", n_clients=4, rng=np.random.default_rng(0))
    assert data.n_classes == 2 and data.input_shape == (30,) and data.standardize
    train = data.pooled()
    assert len(train) + len(data.test) == 569
    assert len(data.test) == pytest.approx(0.2 * 569, abs=2)
    # No test row appears among the training rows.
    train_rows = {row.tobytes() for row in train.x}
    assert not any(row.tobytes() in train_rows for row in data.test.x)
    assert data.test.y.mean() == pytest.approx(train.y.mean(), abs=0.02)


def test_digits_are_images_in_unit_range():
    data = load_federated("digits", n_clients=20, partition="shards", rng=np.random.default_rng(0))
    assert data.input_shape == (1, 8, 8) and data.n_classes == 10 and not data.standardize
    x = data.pooled().x
    assert x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0
    assert len(data.pooled()) + len(data.test) == 1797


def test_too_many_clients_is_refused():
    with pytest.raises(InvalidParameterError, match="exceeds"):
        load_federated("breast_cancer", n_clients=500, rng=np.random.default_rng(0))


def test_random_correlation_is_a_valid_correlation_matrix():
    r = random_correlation(12, np.random.default_rng(0))
    assert np.allclose(np.diag(r), 1.0) and np.allclose(r, r.T)
    assert np.linalg.eigvalsh(r).min() > 0
    off = r[np.triu_indices(12, 1)]
    assert 0.15 < off.mean() < 0.5  # Beta(1, 2) has mean 1/3 before the PSD repair


def _synthetic(setup, k=5, seed=0):
    return load_federated("synthetic", n_clients=k, synthetic_setup=setup, synthetic_samples=5000,
                          synthetic_features=6, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("setup", [1, 2, 3, 4])
def test_synthetic_labels_follow_the_logistic_model(setup):
    data = _synthetic(setup)
    theta, b = data.info["theta"], data.info["intercept"]
    pooled = data.pooled()
    p = 1 / (1 + np.exp(-(b + pooled.x @ theta)))
    if setup in (1, 3):  # the true model predicts the labels it generated
        assert abs(p.mean() - pooled.y.mean()) < 0.03
    assert len(pooled) + len(data.test) == 5000


def test_synthetic_sizes_balanced_or_unbalanced():
    assert len({len(c) for c in _synthetic(1).clients}) == 1
    sizes = [len(c) for c in _synthetic(3).clients]
    assert max(sizes) > 2 * min(sizes)


def test_synthetic_setup_2_damages_one_sensor_of_client_3():
    data = _synthetic(2)
    spread = [c.x[:, SENSOR_FEATURE].std() for c in data.clients]
    healthy = [s for k, s in enumerate(spread) if k != SENSOR_CLIENT]
    assert spread[SENSOR_CLIENT] > 1.7 * max(healthy)
    other = [c.x[:, 1].std() for c in data.clients]
    assert max(other) < 1.3 * min(other)


def test_synthetic_setup_4_shifts_client_means():
    spread = lambda d: np.std([c.x.mean(axis=0) for c in d.clients], axis=0).mean()  # noqa: E731
    assert spread(_synthetic(4)) > 4 * spread(_synthetic(3))


@pytest.mark.parametrize(
    "kw",
    [dict(synthetic_setup=5), dict(synthetic_setup=2, n_clients=2), dict(synthetic_samples=30),
     dict(partition="dirichlet"), dict(synthetic_features=0)],
)
def test_bad_synthetic_arguments(kw):
    args = dict(n_clients=5, rng=np.random.default_rng(0)) | kw
    with pytest.raises(InvalidParameterError):
        load_federated("synthetic", **args)
