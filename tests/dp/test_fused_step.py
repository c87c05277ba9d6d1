"""The fused DP-SGD step equals the naive update, as properties.

``PerExampleClipper.step`` adds alpha (clipped sum + noise) to the parameters in place, on the
fast path with each layer's weighted product fused into its parameter (``addmm_`` and the like).
Over random convolution + linear models and linear stacks, clip bounds from "clips everything"
to "clips nothing", with and without noise, the parameters after one step equal those after the
naive update (each example's full gradient on its own, clipped, summed, :mod:`tests.dp.naive`),
up to float32 rounding. The probe is bypassed (the clipper is marked probed on the fast path), so
a wrong fused step cannot hide behind a fallback; a model the fast path cannot take (tied
weights) and an empty batch go through the fallback and still equal the naive update. The
Bernoulli masks and the float32 noise that DP-SGD draws are the same numbers as before the
change (integer comparison, no float64 copy).
"""

from unittest import mock

import numpy as np
import pytest
import torch
from fedsec.dp import DPSGD, dpsgd, per_sample
from fedsec.dp.noise import SecureRandom
from fedsec.dp.per_sample import PerExampleClipper
from fedsec.fl_core.models import build_model
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.dp.naive import naive_clipped_sum
from tests.dp.test_bookkeeping_clipping import _build, _loss, conv_models


def _fast_clipper(model, bound):
    clipper = PerExampleClipper(model, max_grad_norm=bound)
    assert clipper.layers is not None
    clipper.probed = True  # the fast path, no probe and so no fallback to hide behind
    return clipper


def _expected(model, x, y, bound, alpha, noise):
    want = naive_clipped_sum(model, x, y, bound, _loss)
    return [p.detach() + alpha * (g + (0 if z is None else z))
            for p, g, z in zip(model.parameters(), want, noise or [None] * len(want), strict=True)]


def _assert_params(model, want):
    for p, w in zip(model.parameters(), want, strict=True):
        scale = max(float(w.abs().max()), 1e-3)
        assert torch.allclose(p.detach(), w, rtol=1e-4, atol=1e-5 * scale), float((p - w).abs().max())


@pytest.mark.parametrize("method", ["chosen", "ghost"])
@given(case=conv_models(), alpha=st.sampled_from([-0.5, -1e-3, 2.0]), noisy=st.booleans())
@settings(max_examples=30, deadline=None)
def test_the_fused_step_equals_the_naive_update_on_convolutions(method, case, alpha, noisy):
    *shape, bound, seed = case
    model, x, y = _build(*shape, seed)
    noise = [torch.randn_like(p) for p in model.parameters()] if noisy else None
    want = _expected(model, x, y, bound, alpha, noise)
    clipper = _fast_clipper(model, bound)
    limit = 0 if method == "ghost" else per_sample.EXPLICIT_BYTES
    with mock.patch.object(per_sample, "EXPLICIT_BYTES", limit):
        loss = clipper.step(x, y, _loss, alpha=alpha, noise=noise)
    assert clipper.mode == "fast"
    _assert_params(model, want)
    assert np.isfinite(loss)


@given(batch=st.integers(1, 12), width=st.integers(1, 20), depth=st.integers(1, 3),
       bound=st.sampled_from([1e-3, 0.3, 3.0, 1e3]), noisy=st.booleans(), seed=st.integers(0, 999))
@settings(max_examples=30, deadline=None)
def test_the_fused_step_equals_the_naive_update_on_linear_stacks(batch, width, depth, bound, noisy, seed):
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width, bias=bool(i % 2)), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(width, 3))
    x, y = torch.randn(batch, width), torch.randint(0, 3, (batch,))
    noise = [torch.randn_like(p) for p in model.parameters()] if noisy else None
    want = _expected(model, x, y, bound, -0.1, noise)
    with torch.no_grad():
        total = float(_loss(model(x), y).sum())
    loss = _fast_clipper(model, bound).step(x, y, _loss, alpha=-0.1, noise=noise)
    _assert_params(model, want)
    assert loss == pytest.approx(total, rel=1e-5)


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x)))))


def test_a_layer_run_twice_falls_back_to_the_exact_update():
    """A model whose forward pass runs a fast-path layer twice: the fused step sees it, takes the
    exact path from then on, and the update still equals the naive one."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.head(torch.tanh(self.body(torch.tanh(self.body(x)))))

    torch.manual_seed(3)
    model, x, y = Twice(), torch.randn(6, 4), torch.randint(0, 3, (6,))
    noise = [torch.randn_like(p) for p in model.parameters()]
    want = _expected(model, x, y, 0.2, -0.3, noise)
    clipper = _fast_clipper(model, 0.2)
    clipper.step(x, y, _loss, alpha=-0.3, noise=noise)
    assert clipper.mode == "loop"
    _assert_params(model, want)


def test_tied_weights_and_an_empty_batch_take_the_exact_update():
    torch.manual_seed(4)
    model, x, y = _Tied(), torch.randn(8, 4), torch.randint(0, 3, (8,))
    clipper = PerExampleClipper(model, max_grad_norm=0.2)
    assert clipper.layers is None
    want = _expected(model, x, y, 0.2, -0.3, None)
    clipper.step(x, y, _loss, alpha=-0.3)
    assert clipper.mode != "fast"
    _assert_params(model, want)
    before = [p.detach().clone() for p in model.parameters()]
    noise = [torch.randn_like(p) for p in model.parameters()]
    assert clipper.step(x[:0], y[:0], _loss, alpha=-0.3, noise=noise) == 0.0
    _assert_params(model, [b - 0.3 * z for b, z in zip(before, noise, strict=True)])


@given(p=st.one_of(st.floats(-0.5, 1.5), st.sampled_from([0.0, 1.0, 2.0 ** -53, 1 - 2.0 ** -53, 64 / 456])),
       size=st.integers(0, 300), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_bernoulli_masks_are_exactly_uniform_below_p(p, size, seed):
    a, b = SecureRandom.from_seed(seed, "m"), SecureRandom.from_seed(seed, "m")
    assert np.array_equal(a.bernoulli(p, size), b.uniform(size) < p)
    assert a.state_dict() == b.state_dict()


@given(size=st.integers(1, 40_000), scale=st.sampled_from([1.0, 0.3, 7.0]), seed=st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_float32_noise_is_the_float64_noise_rounded(size, scale, seed):
    wide = SecureRandom.from_seed(seed, "n").normal(size, scale)
    narrow = SecureRandom.from_seed(seed, "n").normal(size, scale, np.float32)
    assert narrow.dtype == np.float32 and np.array_equal(narrow, wide.astype(np.float32))


@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=30), rows=st.integers(1, 25))
@settings(max_examples=60, deadline=None)
def test_the_gathers_cover_every_step_once_within_the_bound(counts, rows):
    bounds = np.concatenate([[0], np.cumsum(counts)])
    ranges = dpsgd._gathers(bounds, rows)
    assert [s for first, last in ranges for s in range(first, last)] == list(range(len(counts)))
    for first, last in ranges:
        assert last == first + 1 or bounds[last] - bounds[first] <= rows


@pytest.mark.parametrize("model_name", ["logreg", "cnn"])
def test_dpsgd_does_not_depend_on_how_the_batches_are_gathered(model_name):
    """The same stream gives the same model whether each step's batch is gathered on its own (a
    bound of one byte) or many steps' batches at once."""
    shape = (1, 8, 8) if model_name == "cnn" else (5,)
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(60, *shape)).astype(np.float32))
    y = torch.from_numpy(np.random.default_rng(1).integers(0, 3, 60))
    models = []
    for limit in (1, dpsgd.GATHER_BYTES):
        model = build_model(model_name, input_shape=shape, n_classes=3, seed=2)
        optimizer = DPSGD(noise_multiplier=1.0, max_grad_norm=0.5, batch_size=8, epochs=2, lr=0.2,
                          random=SecureRandom.from_seed(5, "gather"))
        with mock.patch.object(dpsgd, "GATHER_BYTES", limit):
            optimizer.train(model, x, y, _loss)
        models.append(model)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p, q)


@given(case=conv_models(), scale=st.sampled_from([1.0, 1e2, 1e4, 1e6]), target=st.integers(0, 2),
       index=st.integers(0, 8), search=st.integers(0, 2**16))
@settings(max_examples=20, deadline=None)
def test_an_adversarial_record_moves_the_fused_step_by_at_most_alpha_c(case, scale, target, index, search):
    """Adversary: one record of the batch, chosen to pull hardest (its input scaled up to 1e6 or
    replaced by a random search point, any label), against the unmodified fused step. Adding it
    (DP-SGD's neighbouring relation) moves the parameters after the step by at most |alpha| C in
    L2 norm over all parameters, on both norm methods."""
    *shape, bound, seed = case
    model, x, y = _build(*shape, seed)
    index = index % x.shape[0]
    evil_x, evil_y = x.clone(), y.clone()
    torch.manual_seed(search)
    evil_x[index] = evil_x[index] * scale if search % 2 else torch.randn_like(evil_x[index]) * scale
    evil_y[index] = target
    rest = [i for i in range(x.shape[0]) if i != index]
    start = [p.detach().clone() for p in model.parameters()]
    after = []
    for batch_x, batch_y in ((evil_x, evil_y), (x[rest], y[rest])):
        with torch.no_grad():
            for p, s in zip(model.parameters(), start, strict=True):
                p.copy_(s)
        _fast_clipper(model, bound).step(batch_x, batch_y, _loss, alpha=-0.7)
        after.append([p.detach().clone() for p in model.parameters()])
    moved = torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in zip(*after, strict=True)))
    assert float(moved) <= 0.7 * bound * (1 + 1e-4) + 1e-6
