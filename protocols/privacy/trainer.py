"""DP-SGD as an ``fl_core`` local trainer (example-level privacy for each client's data).

The trainer is the one source of what a round costs: :meth:`DPSGDTrainer.events` says what a
round on n examples will spend, and every call of ``train`` appends what it did spend (its
noise multiplier, sampling rate and steps) to ``reports``, which the budget reads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from fedsec.dp import DPSGD
from fedsec.dp.ledger import GaussianEvent
from fedsec.fl_core.client import LocalTrainer
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.models import per_example_classification_loss
from torch import nn

FULL_BATCH = 2**31
"""Expected batch size standing for "the whole local data set" (sampling rate 1)."""

per_example_loss = per_example_classification_loss
"""The classification loss per example, with its derivative in closed form (DP-SGD's fast path)."""


class DPSGDTrainer(LocalTrainer):
    """Each client runs :class:`dp.DPSGD` on its own data.

    The noise and the Poisson sampling come from the optimiser's SecureRandom, not from ``rng``.
    ``profile(n)`` tells the accountant what one round on n examples costs.

    The training loss is withheld (``train`` returns None): it is a function of the client's
    records that no mechanism in the ledger covers (one canary example moves it far more than
    epsilon allows), so a DP-SGD client sends nothing but its noisy update and its weight.

    Args:
        optimizer: the DP-SGD settings.
        loss: per-example loss ``(outputs, targets) -> [batch]`` (default: the classification loss).
    """

    def __init__(self, optimizer: DPSGD,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        self.optimizer = optimizer
        self.loss = loss or per_example_loss
        self.reports: list[tuple[float, float, int]] = []

    def events(self, n: int) -> list[GaussianEvent]:
        """What one round on ``n`` examples spends, as the ledger records it."""
        q, steps = self.profile(n)
        return [GaussianEvent(self.optimizer.noise_multiplier, q, steps)]

    def take_reports(self) -> list[tuple[float, float, int]]:
        """What the calls since the last ``take_reports`` spent, one ``(noise multiplier, sampling
        rate, steps)`` per call; clears them."""
        reports, self.reports = self.reports, []
        return reports

    def profile(self, n: int) -> tuple[float, int]:
        """(sampling rate, noisy steps) of one round on ``n`` examples."""
        return self.optimizer.sample_rate(n), self.optimizer.steps(n)

    def train(self, model: nn.Module, data: ArrayDataset, *, rng: np.random.Generator) -> None:
        result = self.optimizer.train(model, torch.from_numpy(data.x), torch.from_numpy(data.y),
                                      self.loss)
        self.reports.append((self.optimizer.noise_multiplier, result.sample_rate, result.steps))
        return None
