"""Review r10: per-example sensitivity for a model that mixes the examples of a batch.

FINDING (expected to FAIL today). DP-SGD's bound "one record moves the clipped sum by at most C"
needs every example's loss to depend on that example alone. ``check_model`` (Opacus'
``ModuleValidator``) refuses BatchNorm *modules*, but the library API takes any ``nn.Module``, and a
batch statistic computed functionally (``F.batch_norm(..., training=True)``, ``x - x.mean(0)``)
passes and stays on the fast path. Adding one record then changes every other example's clipped
gradient: the clipped sum moves by far more than C, so the Gaussian noise sigma C covers a
fraction of the real sensitivity and the ledger's epsilon is wrong. The control model without the
batch statistic stays within C (passes). The same happens through ``Federation(loss=...)`` with a
per-example loss that depends on the batch (``_check_loss`` checks only the shape).
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
        x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
        without, _ = clipper.clipped_sum(x, y, _loss)
    except DPError as error:
        assert mix, f"the control model (no batch statistic) was refused: {error}"
        assert "not independent" in str(error)
        return  # refused by the independence probe: defended
    canary_x, canary_y = torch.full((1, 4), 30.0), torch.tensor([1])
    with_, _ = clipper.clipped_sum(torch.cat([x, canary_x]), torch.cat([y, canary_y]), _loss)
    moved = float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(with_, without))))
    assert moved <= C + 1e-5, (
        f"one added record moves the clipped gradient sum by {moved:.2f} > C = {C} "
        f"({clipper.mode} path): the noise sigma*C is calibrated to the wrong sensitivity")


def test_a_loss_that_mixes_the_batch_is_refused_by_the_library_or_stays_within_c():
    """The same through ``Federation(loss=...)``: a per-example loss that is centred on the batch
    (shape [batch], so ``_check_loss`` accepts it) gives the clipped sum a sensitivity above C."""
    import numpy as np

    import fedsec

    def centred(out, y):  # each example's loss weighted by the batch's mean loss
        losses = F.cross_entropy(out, y, reduction="none")
        return losses * losses.mean().detach()

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 2, 20))
               for _ in range(3)]
    model = nn.Linear(4, 2)
    try:
        fedsec.Federation(model=model, clients=clients, test=clients[0], secure=None,
                          loss=centred, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0))
    except ValueError:
        return  # refused: defended
    torch.manual_seed(0)
    clipper = PerExampleClipper(model, max_grad_norm=C)
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    without, _ = clipper.clipped_sum(x, y, centred)
    with_, _ = clipper.clipped_sum(torch.cat([x, torch.full((1, 4), 30.0)]),
                                   torch.cat([y, torch.tensor([1])]), centred)
    moved = float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(with_, without))))
    assert moved <= C + 1e-5, f"one added record moves the clipped sum by {moved:.2f} > C = {C}"
