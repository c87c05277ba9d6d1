"""Review rr10 (FINDING, fails today): the float-buffer refusal under DP-SGD misses frozen parameters.

``Federation._refuse_buffers`` looks at ``module._buffers`` only, but ``get_vector`` releases every
``model.parameters()`` entry, trainable or not, while DP-SGD clips and noises only the trainable
ones. The same running mean as the refused buffer, stored as ``nn.Parameter(requires_grad=False)``,
is accepted and reaches the server raw: one canary record moves it by ~the canary's value.
"""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import fedsec
from fedsec.dp import DPSGD, SecureRandom
from fedsec.fl_core.parameters import get_vector
from fedsec.protocols.privacy.trainer import per_example_loss


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


def test_frozen_parameter_updated_from_inputs_is_released_without_noise():
    # what the client sends: the DP-SGD output vector, which includes the frozen "mean"
    outs = []
    for canary in (0.5, 1e4):
        model = _model()
        x, y = _clients(canary)[0]
        DPSGD(noise_multiplier=2.0, max_grad_norm=1.0, batch_size=20, epochs=1, lr=0.1,
              random=SecureRandom.from_seed(0, "t")).train(
            model, torch.from_numpy(x), torch.from_numpy(y), per_example_loss)
        outs.append(get_vector(model)[:3])  # the frozen mean's three values
    moved = float(np.abs(outs[1] - outs[0]).max())
    assert moved > 100, moved  # the attack works: one record moves a released value by ~1e4 / 40
    # the fix under review should have refused this model, as it refuses the same float buffer
    with pytest.raises(ValueError, match="buffers|frozen|requires_grad"):
        fedsec.Federation(model=_model(), clients=_clients(0.5), secure=None,
                          test=(np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1])),
                          dp=fedsec.DP(mode="dpsgd", noise_multiplier=2.0), rounds=1,
                          batch_size=None, lr=0.1)
