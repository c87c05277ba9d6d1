"""Book-keeping clipping (the fast path) equals the naive per-example computation, as properties.

Over random convolution + linear models (channels, kernel, stride, padding, bias, image size),
batch sizes and clip bounds from "clips nothing" to "clips everything", the clipped sums of the
fast path equal :func:`tests.dp.naive.naive_clipped_sum` (one example at a time, its full gradient
clipped, summed), with each convolution's norms computed both ways (per-example gradients and the
ghost norm), and the gather-based unfold equals ``F.unfold``. The clipper's own probe is bypassed
(``_fast`` is called directly), so a wrong fast path cannot hide behind a fallback.
"""

from unittest import mock

import pytest
import torch
from fedsec.dp import per_sample
from fedsec.dp.per_sample import PerExampleClipper
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tests.dp.naive import naive_clipped_sum


def _loss(outputs, targets):
    return F.cross_entropy(outputs, targets, reduction="none")


@st.composite
def conv_models(draw):
    c_in = draw(st.integers(1, 4))
    c_out = draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)))
    h, w = draw(st.integers(kh, 9)), draw(st.integers(kw, 9))
    bias = draw(st.booleans())
    batch = draw(st.integers(1, 9))
    bound = draw(st.sampled_from([1e-4, 0.05, 0.5, 5.0, 1e4]))
    seed = draw(st.integers(0, 2**16))
    return c_in, c_out, (kh, kw), stride, padding, (h, w), bias, batch, bound, seed


def _build(c_in, c_out, kernel, stride, padding, size, bias, batch, seed):
    torch.manual_seed(seed)
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=bias)
    x = torch.randn(batch, c_in, *size)
    width = conv(x).flatten(1).shape[1]
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(width, 3, bias=bias))
    return model, x, torch.randint(0, 3, (batch,))


def _close(got, want):
    for g, w in zip(got, want, strict=True):
        scale = max(float(w.abs().max()), 1e-3)
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-4 * scale), float((g - w).abs().max())


@pytest.mark.parametrize("method", ["chosen", "ghost"])
@given(case=conv_models())
@settings(max_examples=30)
def test_fast_clipped_sums_equal_the_naive_ones(method, case):
    *shape, bound, seed = case
    model, x, y = _build(*shape, seed)
    clipper = PerExampleClipper(model, max_grad_norm=bound)
    assert clipper.layers is not None
    # "ghost": no per-example gradient may be materialised, so the ghost norm everywhere
    limit = 0 if method == "ghost" else per_sample.EXPLICIT_BYTES
    with mock.patch.object(per_sample, "EXPLICIT_BYTES", limit):
        got, loss = clipper._fast(x, y, _loss)
    _close(got, naive_clipped_sum(model, x, y, bound, _loss))
    with torch.no_grad():
        assert loss == pytest.approx(float(_loss(model(x), y).sum()), rel=1e-5)


@given(case=conv_models())
@settings(max_examples=40)
def test_the_gather_unfold_equals_torch_unfold(case):
    c_in, c_out, kernel, stride, padding, size, bias, batch, _, seed = case
    model, x, _ = _build(c_in, c_out, kernel, stride, padding, size, bias, batch, seed)
    conv = model[0]
    assert torch.equal(per_sample.unfold(conv, x),
                       F.unfold(x, kernel, padding=padding, stride=stride))


@given(batch=st.integers(1, 12), width=st.integers(1, 20), outputs=st.integers(1, 4),
       depth=st.integers(1, 3), bound=st.sampled_from([1e-3, 0.3, 3.0, 1e3]), seed=st.integers(0, 999))
@settings(max_examples=30)
def test_linear_stacks_clip_exactly(batch, width, outputs, depth, bound, seed):
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width, bias=bool(i % 2)), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(width, max(outputs, 2)))
    x, y = torch.randn(batch, width), torch.randint(0, max(outputs, 2), (batch,))
    got, _ = PerExampleClipper(model, max_grad_norm=bound)._fast(x, y, _loss)
    _close(got, naive_clipped_sum(model, x, y, bound, _loss))


def test_both_norm_methods_are_chosen_where_cheaper():
    """Explicit per-example gradients for a first layer on few channels and many positions, the
    ghost norm for a layer with many channels on few positions (the digits CNN's two layers)."""
    first, second = nn.Conv2d(1, 16, 5, padding=2), nn.Conv2d(16, 32, 3, padding=1)
    assert per_sample.conv_method(first, torch.zeros(64, 1, 8, 8), torch.zeros(64, 16, 8, 8)) == "explicit"
    assert per_sample.conv_method(second, torch.zeros(64, 16, 4, 4), torch.zeros(64, 32, 4, 4)) == "ghost"


def test_a_zero_gradient_is_kept_at_scale_one_not_nan():
    """An example whose gradient is exactly zero (a saturated ReLU network) contributes zero, and
    its neighbours are clipped as usual."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        model[0].weight.abs_()
        model[0].bias.fill_(-1.0)  # every hidden unit dead for inputs near zero
    x = torch.randn(4, 3) * 0.01
    x[0] = 100.0  # one example alive
    y = torch.tensor([0, 1, 0, 1])
    got, _ = PerExampleClipper(model, max_grad_norm=0.5)._fast(x, y, _loss)
    assert all(torch.isfinite(g).all() for g in got)
    _close(got, naive_clipped_sum(model, x[:1], y[:1], 0.5, _loss))  # the dead ones add zero


@given(case=conv_models(), scale=st.sampled_from([1.0, 1e2, 1e4, 1e6]), target=st.integers(0, 2),
       index=st.integers(0, 8))
@settings(max_examples=15)
def test_an_adversarial_record_moves_the_clipped_sum_by_at_most_c(case, scale, target, index):
    """Adversary: one record chosen to have the largest pull (inputs scaled up to 1e6, any label).
    Adding it to a batch (the neighbouring relation of DP-SGD) moves the fast path's clipped sum
    by at most C in L2 norm over all parameters."""
    *shape, bound, seed = case
    model, x, y = _build(*shape, seed)
    index = index % x.shape[0]
    evil_x, evil_y = x.clone(), y.clone()
    evil_x[index] = evil_x[index] * scale
    evil_y[index] = target
    rest = [i for i in range(x.shape[0]) if i != index]
    clipper = PerExampleClipper(model, max_grad_norm=bound)
    with_record, _ = clipper._fast(evil_x, evil_y, _loss)
    if rest:
        without, _ = clipper._fast(x[rest], y[rest], _loss)
    else:
        without = [torch.zeros_like(g) for g in with_record]
    moved = torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in zip(with_record, without, strict=True)))
    assert float(moved) <= bound * (1 + 1e-4) + 1e-6
