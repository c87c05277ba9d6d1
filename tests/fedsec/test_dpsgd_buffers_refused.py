"""Float buffers under DP-SGD are refused; under client-level DP they travel inside the noised update.

``Federation(buffers="federate")`` (the default) turns every float buffer into a non-trainable
parameter averaged like the weights. DP-SGD clips and noises only trainable parameters, so a
buffer the model updates from its inputs (a running mean in a user's normalisation module, which
Opacus' validator does not know) would reach the server without noise: one record moved it from
0.04 to 83. Under dp mode "dpsgd" the Federation refuses the model (ValueError naming ``buffers``
and the module). Under client-level DP the federated buffer is part of the clipped, noised update.
"""

import numpy as np
import pytest
import torch
from torch import nn

import fedsec


class RunningCentre(nn.Module):
    """Subtracts a running mean of its inputs (like BatchNorm's running statistics)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(d))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
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


def _federation(mode: str, canary: float = 0.5):
    torch.manual_seed(0)
    model = nn.Sequential(RunningCentre(3), nn.Linear(3, 2))
    test = (np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1]))
    return fedsec.Federation(model=model, clients=_clients(canary), test=test, secure=None,
                             dp=fedsec.DP(mode=mode, noise_multiplier=2.0), rounds=1,
                             batch_size=None, lr=0.1)


def test_a_float_buffer_under_dpsgd_is_refused_naming_buffers_and_the_module():
    with pytest.raises(ValueError, match=r"^buffers: module '0' \(RunningCentre\) holds float "
                                         r"buffers \['mean'\]"):
        _federation("dpsgd")
    fedsec.Federation(model=nn.Linear(3, 2), clients=_clients(0.5), secure=None, rounds=1,
                      dp=fedsec.DP(mode="dpsgd", noise_multiplier=2.0))  # no buffer: accepted


def test_under_client_level_dp_the_buffer_travels_inside_the_noised_update():
    first = _federation("client").run()
    second = _federation("client").run()
    a, b = first.model[0].mean.detach().numpy(), second.model[0].mean.detach().numpy()
    assert np.isfinite(a).all() and not np.array_equal(a, b), (
        "two client-level runs with fresh noise release the same buffer: it carries no noise")
    assert not any("buffer" in entry for entry in first.not_covered)
