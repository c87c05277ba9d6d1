"""DP-SGD as an ``fl_core`` local trainer (example-level privacy for each client's data)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dp import DPSGD
from fl_core.client import LocalTrainer
from fl_core.data import ArrayDataset
from fl_core.models import classification_loss

FULL_BATCH = 2**31
"""Expected batch size standing for "the whole local data set" (sampling rate 1)."""


def per_example_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return classification_loss(outputs, targets, reduction="none")


class DPSGDTrainer(LocalTrainer):
    """Each client runs :class:`dp.DPSGD` on its own data.

    The noise and the Poisson sampling come from the optimiser's SecureRandom, not from ``rng``.
    ``profile(n)`` tells the accountant what one round on n examples costs.

    The training loss is withheld (``train`` returns None): it is a function of the client's
    records that no mechanism in the ledger covers (one canary example moves it far more than
    epsilon allows), so a DP-SGD client sends nothing but its noisy update and its weight.
    """

    def __init__(self, optimizer: DPSGD) -> None:
        self.optimizer = optimizer

    def profile(self, n: int) -> tuple[float, int]:
        """(sampling rate, noisy steps) of one round on ``n`` examples."""
        return self.optimizer.sample_rate(n), self.optimizer.steps(n)

    def train(self, model: nn.Module, data: ArrayDataset, *, rng: np.random.Generator) -> None:
        self.optimizer.train(model, torch.from_numpy(data.x), torch.from_numpy(data.y),
                             per_example_loss)
        return None
