"""Weight sharing the structural check does not see is clipped exactly (or refused with a typed error).

A parameter can be shared functionally (``F.linear(h, self.layer.weight)``, GPT-2-style
``h @ self.emb.weight.T``), from a forward hook, through a parametrization, by old-style
``weight_norm`` (a pre-hook computes the weight), or assigned by a pre-hook; a layer may run
twice while another is unused. Each test compares ``PerExampleClipper.clipped_sum`` with the naive
loop (one example at a time: gradient, clip, sum): the probe picks a path only if it agrees with
the exact per-example gradients, and falls back to the exact path otherwise; a model whose
parameters change when it runs is refused (``UnsupportedModelError``).
"""

import pytest
import torch
from fedsec.dp.errors import DPError
from fedsec.dp.per_sample import PerExampleClipper
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

from tests.dp.naive import naive_clipped_sum

BOUND = 0.2


def _loss(outputs, targets):
    return F.cross_entropy(outputs, targets, reduction="none")




class FunctionalLinearTie(nn.Module):
    """The hidden layer's weight is applied a second time with F.linear (no module call)."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        return self.head(F.linear(h, self.hidden.weight))


class HookTie(nn.Module):
    """A forward hook on the head adds a term through the hidden layer's weight."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)
        self.head.register_forward_hook(
            lambda m, inp, out: out + F.linear(inp[0], self.hidden.weight)[:, :3])

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(x)))


class GPT2StyleTie(nn.Module):
    """Token embedding whose matrix is also the output projection (h @ E^T)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.mix = nn.Linear(5, 5)

    def forward(self, tokens):
        h = torch.tanh(self.mix(self.emb(tokens).mean(1)))
        return h @ self.emb.weight.T


class TwiceAndUnused(nn.Module):
    """`first` runs twice; `spare` is trainable but not used on this input."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.spare = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.first(torch.tanh(self.first(x)))))


class Scaled(nn.Module):
    def forward(self, w):
        return 2.0 * w


def _parametrized():
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    parametrize.register_parametrization(model[0], "weight", Scaled())
    return model


def _weight_norm():
    """Old-style weight norm: a forward pre-hook computes `weight` from weight_g and weight_v."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nn.Sequential(nn.utils.weight_norm(nn.Linear(6, 6)), nn.Tanh(), nn.Linear(6, 3))


class HookAssignedTie(nn.Module):
    """A forward pre-hook ties `second` to `first` at run time (weight-tying through hooks)."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.second.register_forward_pre_hook(
            lambda module, inputs: setattr(module, "weight", self.first.weight))

    def forward(self, x):
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x)))))


def _inputs(model):
    torch.manual_seed(2)
    if isinstance(model, GPT2StyleTie):
        return torch.randint(0, 7, (10, 4)), torch.randint(0, 7, (10,))
    return torch.randn(10, 6), torch.randint(0, 3, (10,))


@pytest.mark.parametrize("build", [FunctionalLinearTie, HookTie, GPT2StyleTie, TwiceAndUnused,
                                   _parametrized, _weight_norm, HookAssignedTie])
def test_shared_weights_are_clipped_exactly_or_refused(build):
    torch.manual_seed(1)
    model = build()
    x, y = _inputs(model)
    try:
        clipper = PerExampleClipper(model, max_grad_norm=BOUND)
        got, _ = clipper.clipped_sum(x, y, _loss)
    except DPError:
        return  # refused with a typed error: defended
    want = naive_clipped_sum(model, x, y, BOUND)
    mode = clipper.mode
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5), (
            f"{build.__name__}: the {mode} path's clipped sum differs from the naive one by "
            f"{float((g - w).abs().max()):.4f}")
