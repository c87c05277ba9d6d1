"""Review r10: models the fast path accepts and then crashes on with an untyped error.

FINDING, low (expected to FAIL today). ``PerExampleClipper`` picks the fast path from the module
structure alone. A trainable layer whose output does not reach the loss (an auxiliary head that
is computed but unused) makes ``torch.autograd.grad`` raise a bare RuntimeError, and a Linear
called with a keyword argument (``layer(input=x)``) gives the recording hook no positional input
(IndexError). A federated DP-SGD run on either model dies with that error instead of taking the
exact path or refusing the model with a typed error naming it.
"""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dp.errors import DPError
from dp.per_sample import PerExampleClipper


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
def test_the_clipper_handles_or_refuses_the_model_with_a_typed_error(build):
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    try:
        PerExampleClipper(model, max_grad_norm=1.0).clipped_sum(x, y, _loss)
    except DPError:
        pass  # refused with a typed error: defended
