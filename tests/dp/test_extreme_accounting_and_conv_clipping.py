"""Accountants at extreme regimes, and the Conv2d fast path against the naive computation.

- Accountants at extreme regimes (q = 1 with sigma 0.3 or 0.5, q near 1, large delta, tiny delta):
  pld, prv and rdp never report below dp-accounting's pessimistic PLD at discretisation 1e-4
  (minus 1e-3), i.e. never below the tight value.
- The Conv2d fast path (strides, asymmetric kernels and padding, both norm branches, with and
  without bias) equals the naive per-example clip-and-sum.
"""

import itertools

import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from fedsec.dp.accountants import epsilon
from fedsec.dp.per_sample import PerExampleClipper
from torch import nn
from torch.nn import functional as F

from tests.dp.naive import naive_clipped_sum


def _tight(q, sigma, steps, delta):
    dist = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=1e-4,
                                           pessimistic_estimate=True, use_connect_dots=True)
    return dist.self_compose(steps).get_epsilon_for_delta(delta)


@pytest.mark.parametrize("q,sigma,steps,delta", [(1.0, 0.5, 1, 1e-5), (1.0, 0.3, 10, 1e-5),
                                                 (0.99, 0.5, 5, 1e-8), (1.0, 0.7, 3, 0.3)])
@pytest.mark.parametrize("mechanism", ["pld", "prv", "rdp"])
def test_no_accountant_reports_below_the_tight_value(q, sigma, steps, delta, mechanism):
    reported = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta,
                       mechanism=mechanism)
    assert reported >= _tight(q, sigma, steps, delta) - 1e-3




@pytest.mark.parametrize("cout,k,s,p,bias", list(itertools.product(
    [2, 16], [(3, 3), (3, 2)], [1, 3], [0, (1, 0)], [True, False])))
def test_the_conv_fast_path_clips_exactly(cout, k, s, p, bias):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, cout, k, stride=s, padding=p, bias=bias)
    x = torch.randn(5, 3, 8, 9)
    width = conv(x).flatten(1).shape[1]
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(width, 3))
    y = torch.randint(0, 3, (5,))
    clipper = PerExampleClipper(model, max_grad_norm=0.3)
    assert clipper.mode == "fast"
    got, _ = clipper.clipped_sum(x, y, lambda o, t: F.cross_entropy(o, t, reduction="none"))
    for g, w in zip(got, naive_clipped_sum(model, x, y, 0.3), strict=True):
        assert torch.allclose(g, w, atol=1e-5)
