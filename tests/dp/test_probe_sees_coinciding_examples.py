"""The independence probe also runs on synthetic inputs and on a spread of the client's examples, so
a batch-centring model (``x - x.mean(0)``) is refused even when the first examples coincide
(duplicated rows, a data set sorted by its features), where it would give one record a
sensitivity far above C.
"""

import numpy as np
import pytest
import torch
from fedsec.dp.errors import UnsupportedModelError
from fedsec.dp.per_sample import PROBE_SIZE, PerExampleClipper, spread_indices, synthetic_like
from fedsec.protocols.privacy.trainer import per_example_loss
from torch import nn

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


def test_batch_centring_is_refused_on_a_diverse_probe():  # defended
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
    with pytest.raises(UnsupportedModelError, match="not independent"):
        _clipper().probe(x, y, per_example_loss)


def test_batch_centring_is_refused_when_the_probe_examples_coincide():
    g = torch.Generator().manual_seed(1)
    first = torch.randn(1, 4, generator=g).repeat(8, 1)
    with pytest.raises(UnsupportedModelError, match="not independent"):
        _clipper().probe(first, torch.tensor([0, 1] * 4), per_example_loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_synthetic_inputs_match_shape_dtype_and_range(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(3, 7, (8, 5), generator=g).to(dtype)
    fake = synthetic_like(x, np.random.default_rng(0))
    assert fake.shape == x.shape and fake.dtype == dtype
    assert int(fake.min()) >= 3 and int(fake.max()) <= 6 and len(torch.unique(fake)) > 1


def test_spread_indices_cover_the_data_beyond_the_first_examples():
    index = spread_indices(1000, np.random.default_rng(0))
    assert index[:PROBE_SIZE] == list(range(PROBE_SIZE))
    assert len(set(index)) == 2 * PROBE_SIZE and max(index) >= 500 and max(index) < 1000
    assert spread_indices(5, np.random.default_rng(0)) == [0, 1, 2, 3, 4]


def test_dpsgd_refuses_batch_centring_when_only_later_examples_differ():
    from fedsec.dp import DPSGD, SecureRandom

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(1, 4, generator=g).repeat(8, 1), torch.randn(40, 4, generator=g)])
    y = torch.randint(0, 2, (48,), generator=g)
    with pytest.raises(UnsupportedModelError, match="not independent"):
        DPSGD(noise_multiplier=1.0, max_grad_norm=C, batch_size=8, lr=0.1,
              random=SecureRandom.from_seed(0, "c")).train(Centred(), x, y, per_example_loss)
