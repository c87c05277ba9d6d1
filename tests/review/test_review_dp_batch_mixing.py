"""Review r10: per-example sensitivity for a model that mixes the examples of a batch.

FINDING (expected to FAIL today). DP-SGD's bound "one record moves the clipped sum by at most C"
needs every example's loss to depend on that example alone. ``check_model`` (Opacus'
``ModuleValidator``) refuses BatchNorm *modules*, but the library API takes any ``nn.Module``, and a
batch statistic computed functionally (``F.batch_norm(..., training=True)``, ``x - x.mean(0)``)
passes and stays on the fast path. Adding one record then changes every other example's clipped
gradient: the clipped sum moves by far more than C, so the Gaussian noise sigma C covers a
fraction of the real sensitivity and the ledger's epsilon is wrong. The control model without the
batch statistic stays within C.
"""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dp.errors import DPError
from dp.per_sample import PerExampleClipper, check_model

C = 1.0


class FunctionalBatchNorm(nn.Module):
    def __init__(self, mix: bool):
        super().__init__()
        self.mix = mix
        self.first = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.first(x)
        if self.mix:
            h = F.batch_norm(h, None, None, training=True)
        return self.head(torch.tanh(h))


def _loss(out, y):
    return F.cross_entropy(out, y, reduction="none")


@pytest.mark.parametrize("mix", [True, False], ids=["batch-statistic", "control"])
def test_one_added_record_moves_the_clipped_sum_by_at_most_c(mix):
    torch.manual_seed(0)
    model = FunctionalBatchNorm(mix)
    try:
        check_model(model)
        clipper = PerExampleClipper(model, max_grad_norm=C)
    except DPError:
        return  # refused: defended
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    canary_x, canary_y = torch.full((1, 4), 30.0), torch.tensor([1])
    without, _ = clipper.clipped_sum(x, y, _loss)
    with_, _ = clipper.clipped_sum(torch.cat([x, canary_x]), torch.cat([y, canary_y]), _loss)
    moved = float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(with_, without))))
    assert moved <= C + 1e-5, (
        f"one added record moves the clipped gradient sum by {moved:.2f} > C = {C} "
        f"({clipper.mode} path): the noise sigma*C is calibrated to the wrong sensitivity")
