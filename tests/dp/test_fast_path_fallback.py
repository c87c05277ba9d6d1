"""Models the fast path accepts structurally and then cannot handle take the exact path.

A trainable layer whose output does not reach the loss (an auxiliary head, computed but unused)
and a Linear called with a keyword argument (``layer(input=x)``: the recording hook sees no
positional input) used to crash with a bare RuntimeError / IndexError. The probe sees the fast
path fail and the clipper uses an exact path instead, whose clipped sum equals the naive one.
"""

import pytest
import torch
from fedsec.dp.errors import DPError
from fedsec.dp.per_sample import PerExampleClipper
from torch import nn
from torch.nn import functional as F

from tests.dp.naive import naive_clipped_sum


class UnusedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.main, self.aux = nn.Linear(4, 3), nn.Linear(4, 2)

    def forward(self, x):
        self.aux(x)  # computed, not used by this loss
        return self.main(x)


class KeywordCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Linear(4, 3)

    def forward(self, x):
        return self.main(input=x)


def _loss(out, y):
    return F.cross_entropy(out, y, reduction="none")




@pytest.mark.parametrize("build", [UnusedHead, KeywordCall])
def test_the_clipper_takes_an_exact_path_when_the_fast_path_fails(build):
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    clipper = PerExampleClipper(model, max_grad_norm=0.3)
    assert clipper.mode == "fast"  # chosen from the structure alone
    got, _ = clipper.clipped_sum(x, y, _loss)
    assert clipper.mode != "fast"
    for g, w in zip(got, naive_clipped_sum(model, x, y, 0.3), strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    again, _ = clipper.clipped_sum(x[:3], y[:3], _loss)  # later batches keep working
    for g, w in zip(again, naive_clipped_sum(model, x[:3], y[:3], 0.3), strict=True):
        assert torch.allclose(g, w, atol=1e-5)


def test_a_model_that_fails_on_every_path_gets_a_typed_error():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Linear(4, 3)

        def forward(self, x):
            if x.shape[0] == 1:
                raise RuntimeError("needs a batch")
            return self.main(x)

    with pytest.raises(DPError, match="single example"):
        PerExampleClipper(Broken(), max_grad_norm=1.0).clipped_sum(
            torch.randn(6, 4), torch.randint(0, 3, (6,)), _loss)
