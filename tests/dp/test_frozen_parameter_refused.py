"""DP-SGD refuses what it would release without noise: a frozen float parameter (``get_vector``
releases every parameter, DP-SGD noises only the trainable ones; a running mean kept as
``nn.Parameter(requires_grad=False)`` would carry one canary record raw), and any parameter or
buffer that a forward pass changes (adversary: an honest-but-careless model author; the curious
server reads the released vector).
"""

import numpy as np
import pytest
import torch
from fedsec.dp import DPSGD, SecureRandom
from fedsec.dp.errors import UnsupportedModelError
from fedsec.dp.per_sample import PerExampleClipper
from fedsec.fl_core.parameters import get_vector
from fedsec.protocols.privacy.trainer import per_example_loss
from torch import nn

import fedsec


class FrozenRunningCentre(nn.Module):
    """Centres by a running mean of its inputs at evaluation (BatchNorm-like), the mean kept as a
    frozen parameter rather than a buffer."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mean = nn.Parameter(torch.zeros(d), requires_grad=False)

    def forward(self, x):
        if self.training:  # like BatchNorm: record running statistics, use them at evaluation
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
            return x
        return x - self.mean


def _clients(canary: float):
    rng = np.random.default_rng(0)
    out = []
    for k in range(3):
        x = rng.normal(size=(20, 3)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        if k == 0:
            x[0, 1] = canary
        out.append((x, y))
    return out


def _model():
    torch.manual_seed(0)
    return nn.Sequential(FrozenRunningCentre(3), nn.Linear(3, 2))


def test_dpsgd_refuses_a_frozen_float_parameter():
    model = _model()
    x, y = _clients(1e4)[0]
    before = get_vector(model).copy()
    with pytest.raises(UnsupportedModelError, match=r"'0\.mean' is frozen"):
        DPSGD(noise_multiplier=2.0, max_grad_norm=1.0, batch_size=20, epochs=1, lr=0.1,
              random=SecureRandom.from_seed(0, "t")).train(
            model, torch.from_numpy(x), torch.from_numpy(y), per_example_loss)
    np.testing.assert_array_equal(get_vector(model), before)  # refused before any step


def test_federation_refuses_a_frozen_float_parameter():
    with pytest.raises(ValueError, match="frozen"):
        fedsec.Federation(model=_model(), clients=_clients(0.5), secure=None,
                          test=(np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1])),
                          dp=fedsec.DP(mode="dpsgd", noise_multiplier=2.0), rounds=1,
                          batch_size=None, lr=0.1)


class ShrinksWeight(nn.Module):
    """Renormalises its trainable weight in place from the inputs (like Embedding max_norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(1.0 / (1.0 + x.abs().max()))
        return self.lin(x)


class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("model, name", [(ShrinksWeight, "lin.weight"), (CountsCalls, "calls")])
def test_probe_refuses_state_changed_by_a_forward_pass(model, name):
    torch.manual_seed(0)
    clipper = PerExampleClipper(model(), max_grad_norm=1.0)
    x, y = torch.randn(8, 3), torch.tensor([0, 1] * 4)
    with pytest.raises(UnsupportedModelError, match=f"'{name}' changes during a forward pass"):
        clipper.probe(x, y, per_example_loss)


def test_probe_accepts_an_unchanging_model():
    torch.manual_seed(0)
    clipper = PerExampleClipper(nn.Linear(3, 2), max_grad_norm=1.0)
    assert clipper.probe(torch.randn(8, 3), torch.tensor([0, 1] * 4), per_example_loss) == "fast"
