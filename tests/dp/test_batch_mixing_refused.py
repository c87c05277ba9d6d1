"""Per-example sensitivity needs independent examples: a model or loss that mixes the batch is refused.

DP-SGD's bound "one record moves the clipped sum by at most C" needs every example's loss to
depend on that example alone. Opacus' validator refuses BatchNorm modules, but a batch statistic
computed functionally (``F.batch_norm(..., training=True)``) or a per-example loss weighted by
a batch mean passes it. The independence probe of ``PerExampleClipper`` (run before the first
clipped sum, and by ``Federation`` at construction) refuses both with a typed error; the control
model without the statistic is accepted and stays within C.
"""

import pytest
import torch
from fedsec.dp.errors import DPError
from fedsec.dp.per_sample import PerExampleClipper, check_model
from torch import nn
from torch.nn import functional as F

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


def test_a_loss_that_mixes_the_batch_is_refused_by_the_library_and_the_clipper():
    """The same through ``Federation(loss=...)``: a per-example loss weighted by the batch's mean
    loss (shape [batch], so the shape check accepts it) gives the clipped sum a sensitivity above
    C; the Federation refuses it at construction, the clipper before its first clipped sum."""
    import numpy as np

    import fedsec

    def centred(out, y):  # each example's loss weighted by the batch's mean loss
        losses = F.cross_entropy(out, y, reduction="none")
        return losses * losses.mean().detach()

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 2, 20))
               for _ in range(3)]
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="loss: .*not independent"):
        fedsec.Federation(model=model, clients=clients, test=clients[0], secure=None,
                          loss=centred, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0))
    fedsec.Federation(model=model, clients=clients, test=clients[0], secure=None,  # the control
                      loss=_loss, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0))
    with pytest.raises(DPError, match="not independent"):
        PerExampleClipper(model, max_grad_norm=C).clipped_sum(
            torch.randn(32, 4), torch.randint(0, 2, (32,)), centred)


def test_dropout_modules_do_not_trip_the_probe():
    """nn.Dropout is switched off for the probe (its masks differ between a batch and one example
    by design, not by mixing); the model is then trained with dropout on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    clipper = PerExampleClipper(model, max_grad_norm=C)
    grads, _ = clipper.clipped_sum(torch.randn(16, 4), torch.randint(0, 2, (16,)), _loss)
    assert clipper.mode == "fast" and model[1].training
    assert float(torch.sqrt(sum((g ** 2).sum() for g in grads))) <= 16 * C + 1e-4
