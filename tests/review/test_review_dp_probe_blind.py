"""Review rr10: the per-example independence probe looks at the client's first 8 examples only.

FINDING (fails today): a batch-centring model (``x - x.mean(0)``, which docs/privacy.md says "fails
this, and the model is refused") passes the probe when the first 8 examples coincide (duplicated
rows, a data set sorted by its features), and later batches then give one added record a
sensitivity far above C.  DEFENDED (passes): the same model is refused on a diverse probe batch.
"""

import pytest
import torch
from torch import nn

from fedsec.dp.errors import UnsupportedModelError
from fedsec.dp.per_sample import PerExampleClipper
from fedsec.protocols.privacy.trainer import per_example_loss

C = 1.0


class Centred(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x - x.mean(0, keepdim=True))


def _clipper():
    torch.manual_seed(0)
    return PerExampleClipper(Centred(), max_grad_norm=C)


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def test_batch_centring_is_refused_on_a_diverse_probe():  # defended
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
    with pytest.raises(UnsupportedModelError, match="not independent"):
        _clipper().probe(x, y, per_example_loss)


def test_batch_centring_passes_the_probe_when_the_first_examples_coincide():  # finding
    g = torch.Generator().manual_seed(1)
    clipper = _clipper()
    first = torch.randn(1, 4, generator=g).repeat(8, 1)
    try:
        clipper.probe(first, torch.tensor([0, 1] * 4), per_example_loss)
    except UnsupportedModelError:
        return  # refused: the fix holds
    # accepted: measure one record's effect on a later batch's clipped sum
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)
    canary = torch.full((1, 4), 50.0)
    without, _ = clipper.clipped_sum(x, y, per_example_loss)
    with_, _ = clipper.clipped_sum(torch.cat([x, canary]), torch.cat([y, torch.tensor([1])]),
                                   per_example_loss)
    moved = float((_flat(with_) - _flat(without)).norm())
    assert moved <= C * (1 + 1e-4), (
        f"probe accepted a batch-centring model (first 8 examples equal); one record moved the "
        f"clipped sum by {moved:.2f} > C = {C}")
