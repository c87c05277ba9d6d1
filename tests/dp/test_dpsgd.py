"""Per-example clipping is exact, unsupported models are refused, DP-SGD's noise is its own."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedsec.dp import DPSGD, InvalidPrivacyParameterError, SecureRandom, UnsupportedModelError
from fedsec.dp.per_sample import PerExampleClipper
from fedsec.fl_core.models import SmallCNN, build_model, classification_loss
from torch import nn

from tests.dp.naive import naive_clipped_sum


def _loss(outputs, targets):
    return classification_loss(outputs, targets, reduction="none")




class _Normed(nn.Module):  # LayerNorm: not on the fast path, handled by Opacus' hooks
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn", "layernorm"])
def test_clipped_sums_equal_the_naive_per_example_computation(name):
    torch.manual_seed(0)
    if name == "cnn":
        model, x, y = SmallCNN(1, 8, 10), torch.randn(12, 1, 8, 8), torch.randint(0, 10, (12,))
    elif name == "layernorm":
        model, x, y = _Normed(), torch.randn(12, 6), torch.randint(0, 3, (12,))
    else:
        features, classes = (30, 2) if name == "logreg" else (64, 10)
        model = build_model(name, input_shape=(features,), n_classes=classes, seed=0)
        x, y = torch.randn(12, features), torch.randint(0, classes, (12,))
    clipper = PerExampleClipper(model, max_grad_norm=0.3)
    grads, _ = clipper.clipped_sum(x, y, _loss)
    assert clipper.mode == ("opacus" if name == "layernorm" else "fast")
    for got, want in zip(grads, naive_clipped_sum(model, x, y, 0.3, _loss), strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_batch_norm_is_refused_with_a_clear_message():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(UnsupportedModelError, match="BatchNorm"):
        PerExampleClipper(model, max_grad_norm=1.0)


def _train(random, monkeypatch=None):
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=1)
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32))
    y = (x[:, 0] > 0).long()
    result = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=10, epochs=2, lr=0.1,
                   random=random).train(model, x, y, _loss)
    return model, result


def test_dpsgd_noise_and_sampling_come_from_its_secure_random(monkeypatch):
    a, result = _train(SecureRandom.from_seed(3, "t"))
    b, _ = _train(SecureRandom.from_seed(3, "t"))
    c, _ = _train(SecureRandom.from_seed(4, "t"))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    assert (result.sample_rate, result.steps) == (0.2, 10)
    monkeypatch.setattr(torch, "randn", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    monkeypatch.setattr(torch, "normal", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    _train(SecureRandom())  # neither torch's nor numpy's generator is touched


def test_noise_has_the_calibrated_scale():
    model = nn.Linear(3, 1, bias=False)
    nn.init.zeros_(model.weight)
    x, y = torch.zeros(400, 3), torch.zeros(400, dtype=torch.long)
    opt = DPSGD(noise_multiplier=2.0, max_grad_norm=1.5, batch_size=400, epochs=1, lr=1.0,
                random=SecureRandom(bytes(32)))
    deltas = []
    for _ in range(300):
        nn.init.zeros_(model.weight)
        opt.train(model, x, y, lambda o, t: (o[:, 0] * 0).float())  # zero gradients: pure noise
        deltas.append(model.weight.detach().numpy().ravel().copy())
    std = np.std(np.concatenate(deltas)) * 400  # lr / expected batch = 1 / 400
    assert abs(std / (2.0 * 1.5) - 1) < 0.06


class _TiedLayers(nn.Module):
    """Two Linear layers sharing one weight matrix (a tied autoencoder-style stack)."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x)))))


class _TiedEmbedding(nn.Module):
    """A token model whose output layer reuses the input embedding (tied embeddings)."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(7, 5), nn.Linear(5, 7)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.embed(tokens).mean(1)))


@pytest.mark.parametrize("tied", [_TiedLayers, _TiedEmbedding])
def test_tied_parameters_leave_the_fast_path_and_clip_exactly(tied):
    torch.manual_seed(1)
    model = tied()
    if tied is _TiedLayers:
        x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    else:
        x, y = torch.randint(0, 7, (10, 4)), torch.randint(0, 7, (10,))
    clipper = PerExampleClipper(model, max_grad_norm=0.2)
    assert clipper.mode == "opacus"
    grads, _ = clipper.clipped_sum(x, y, _loss)
    want = naive_clipped_sum(model, x, y, 0.2, _loss)
    assert len(grads) == len(want) == len(list(model.parameters()))
    for got, expected in zip(grads, want, strict=True):
        assert torch.allclose(got, expected, atol=1e-5)


def test_the_fast_path_would_get_tied_weights_wrong():
    """The control: the fast path's per-layer formula differs from the naive sum on a tied model,
    so the test above can fail."""
    torch.manual_seed(1)
    model, x, y = _TiedLayers(), torch.randn(10, 6), torch.randint(0, 3, (10,))
    clipper = PerExampleClipper(model, max_grad_norm=0.2)
    clipper.layers = [model.first, model.second, model.head]
    for layer in clipper.layers:
        layer.register_forward_hook(clipper._record)
    fast, _ = clipper._fast(x, y, _loss)
    want = naive_clipped_sum(model, x, y, 0.2, _loss)
    assert not torch.allclose(fast[0], want[0], atol=1e-4)


@pytest.mark.parametrize("n", [20, 400])
def test_a_fixed_sample_rate_makes_steps_and_noise_independent_of_the_size(n):
    """With sample_rate q fixed, the steps are round(1 / q) per epoch and the divisor is the
    constant B, so a model whose loss has no gradient moves by noise of std
    lr sigma C sqrt(steps) / B, whatever n."""
    model = nn.Linear(500, 4)
    start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = DPSGD(noise_multiplier=2.0, max_grad_norm=0.5, batch_size=8, lr=0.1, sample_rate=0.05,
                random=SecureRandom())
    assert opt.steps(n) == 20 and opt.sample_rate(n) == 0.05
    result = opt.train(model, torch.randn(n, 500), torch.zeros(n, dtype=torch.long),
                       lambda out, y: 0.0 * out.sum(1))
    assert result.steps == 20 and result.sample_rate == 0.05
    moved = torch.cat([p.detach().flatten() for p in model.parameters()]) - start
    expected = 0.1 * 2.0 * 0.5 * math.sqrt(20) / 8
    assert float(moved.std()) == pytest.approx(expected, rel=0.1)


def test_a_sample_rate_outside_0_1_is_refused():
    with pytest.raises(InvalidPrivacyParameterError, match="sample_rate"):
        DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=8, sample_rate=1.5)
