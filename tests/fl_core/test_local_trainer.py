"""TorchTrainer: optimisers, a user loss, and FedProx's proximal term; FedProx's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedsec.fl_core import ArrayDataset, FedAvg, FedProx, SGDTrainer, TorchTrainer, get_vector, set_vector
from fedsec.fl_core.errors import InvalidParameterError
from torch import nn


def _data(n: int = 64, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    return ArrayDataset(x, (x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int64))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))


def _delta(trainer, data=None) -> np.ndarray:
    model = _model()
    start = get_vector(model)
    trainer.train(model, data or _data(), rng=np.random.default_rng(1))
    return get_vector(model) - start


def test_plain_sgd_matches_the_bundled_trainer():
    ours = _delta(TorchTrainer(epochs=2, batch_size=16, lr=0.1))
    bundled = _delta(SGDTrainer(epochs=2, batch_size=16, lr=0.1))
    np.testing.assert_allclose(ours, bundled, rtol=1e-4, atol=1e-6)


def test_momentum_and_adam_change_the_update():
    sgd = _delta(TorchTrainer(epochs=1, batch_size=8, lr=0.05))
    momentum = _delta(TorchTrainer(epochs=1, batch_size=8, lr=0.05, momentum=0.9))
    adam = _delta(TorchTrainer(epochs=1, batch_size=8, lr=0.05, optimizer="adam"))
    assert np.linalg.norm(momentum) > 1.5 * np.linalg.norm(sgd)
    assert not np.allclose(adam, sgd, atol=1e-3)


def test_the_proximal_term_pulls_towards_the_global_model():
    norms = [np.linalg.norm(_delta(TorchTrainer(epochs=5, batch_size=8, lr=0.1, prox_mu=mu)))
             for mu in (0.0, 1.0, 5.0)]
    assert norms[0] > norms[1] > norms[2] > 0


def test_the_proximal_term_has_its_closed_form():
    """A loss whose gradient is -1 on one weight and 0 elsewhere: with the proximal term, T full-batch
    SGD steps move that weight by (1 / mu)(1 - (1 - lr mu)^T) and leave every other weight alone."""
    model = _model()
    anchor = get_vector(model)
    first = model[0].weight

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -first[0, 0] * torch.ones(out.shape[0]) + 0.0 * out[:, 0]

    lr, mu, steps = 0.1, 2.0, 5
    TorchTrainer(epochs=steps, batch_size=0, lr=lr, prox_mu=mu, loss=loss).train(
        model, _data(8), rng=np.random.default_rng(0))
    moved = get_vector(model) - anchor
    assert moved[0] == pytest.approx((1 - (1 - lr * mu) ** steps) / mu, rel=1e-5)
    np.testing.assert_array_equal(moved[1:], 0.0)


def test_a_scalar_loss_and_bad_settings_are_refused_by_name():
    with pytest.raises(InvalidParameterError, match="one value per example"):
        _delta(TorchTrainer(epochs=1, batch_size=8, lr=0.1, loss=lambda out, y: out.mean()))
    for kwargs, key in [({"optimizer": "rmsprop"}, "optimizer"), ({"momentum": 1.0}, "momentum"),
                        ({"optimizer": "adam", "momentum": 0.5}, "momentum"),
                        ({"weight_decay": -1.0}, "weight_decay"), ({"prox_mu": -0.1}, "prox_mu"),
                        ({"lr": 0.0}, "lr"), ({"epochs": 0}, "local_epochs")]:
        settings = {"epochs": 1, "batch_size": 8, "lr": 0.1, **kwargs}
        with pytest.raises(InvalidParameterError, match=key):
            TorchTrainer(**settings)


def test_fedprox_needs_a_proximal_trainer():
    with pytest.raises(InvalidParameterError, match="proximal term"):
        FedProx(trainer=SGDTrainer(epochs=1, batch_size=8, lr=0.1))
    with pytest.raises(InvalidParameterError, match="prox_mu > 0"):
        FedProx(trainer=TorchTrainer(epochs=1, batch_size=8, lr=0.1))
    strategy = FedProx(trainer=TorchTrainer(epochs=3, batch_size=8, lr=0.1, prox_mu=5.0))
    plain = FedAvg(trainer=TorchTrainer(epochs=3, batch_size=8, lr=0.1))
    model = _model()
    w = get_vector(model)
    prox = strategy.client_update(model, w, _data(), rng=np.random.default_rng(3)).vector
    avg = plain.client_update(model, w, _data(), rng=np.random.default_rng(3)).vector
    assert strategy.name == "fedprox" and np.linalg.norm(prox) < np.linalg.norm(avg)
    set_vector(model, w)


def test_a_dataset_stores_canonical_strides_so_a_copy_trains_to_the_same_bits():
    """(n, 1, 8, 8) images strided like channels-last (as ``x[:, None]`` gives) would send the CNN
    through another convolution kernel than their pickled copy: the dataset normalises them."""
    import pickle

    from fedsec.fl_core import build_model

    rng = np.random.default_rng(0)
    images = rng.random((30, 8, 8), dtype=np.float32)[:, None]
    assert images.strides != (256, 256, 32, 4)
    data = ArrayDataset(images, rng.integers(0, 10, 30))
    assert data.x.strides == (256, 256, 32, 4) and data.y.strides == (8,)
    np.testing.assert_array_equal(data.x, images)
    plain = np.zeros((4, 3), dtype=np.float32)
    assert ArrayDataset(plain, np.zeros(4, dtype=np.int64)).x is plain  # nothing copied when canonical
    copy = pickle.loads(pickle.dumps(data))
    model = build_model("cnn", input_shape=(1, 8, 8), n_classes=10, seed=0)
    strategy = FedAvg(trainer=TorchTrainer(epochs=1, batch_size=10, lr=0.1))
    start = get_vector(model).copy()
    first = strategy.client_update(model, start, data, rng=np.random.default_rng(1)).vector
    second = strategy.client_update(model, start, copy, rng=np.random.default_rng(1)).vector
    np.testing.assert_array_equal(first, second)
