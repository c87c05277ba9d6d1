"""A configurable local trainer: a torch optimiser (SGD with momentum, or Adam), any per-example
loss, and an optional FedProx proximal term.

:class:`fl_core.client.SGDTrainer` stays the bundled experiments' trainer (its numbers are
pinned by tests); this one is what the library API builds for a user's own model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from fedsec.fl_core.client import LocalTrainer, batches
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.models import per_example_classification_loss
from torch import nn

PerExampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(outputs, targets) -> one loss per example (shape ``[batch]``)."""

OPTIMIZERS = ("sgd", "adam")


default_loss = per_example_classification_loss
"""The loss by task: logistic for one output unit, softmax cross-entropy for more; per example
(``(outputs, targets) -> [batch]``), with its derivative in closed form for DP-SGD's fast path."""


class TorchTrainer(LocalTrainer):
    """E epochs of minibatch training with a fresh torch optimiser every round.

    The optimiser state (momentum, Adam moments) lives for one round only: a client keeps no state
    between rounds, so what it sends depends only on the global model and its data.

    Args:
        epochs: E, full passes over the local data, >= 1.
        batch_size: B >= 0; 0 means the full local batch (one step per epoch).
        lr: learning rate, > 0.
        optimizer: ``sgd`` or ``adam``.
        momentum: SGD momentum in [0, 1) (ignored by Adam, which must then leave it at 0).
        weight_decay: L2 penalty >= 0, as torch applies it.
        prox_mu: FedProx's mu >= 0: adds (mu / 2) ||w - w_global||^2 to the loss, where w_global
            is the model at the start of the round (0 = plain FedAvg).
        loss: per-example loss ``(outputs, targets) -> [batch]``; default :func:`default_loss`.
    """

    def __init__(self, *, epochs: int, batch_size: int, lr: float, optimizer: str = "sgd",
                 momentum: float = 0.0, weight_decay: float = 0.0, prox_mu: float = 0.0,
                 loss: PerExampleLoss | None = None) -> None:
        if epochs < 1:
            raise InvalidParameterError(f"local_epochs must be >= 1, got {epochs}")
        if batch_size < 0:
            raise InvalidParameterError(f"batch_size must be >= 0 (0 = full batch), got {batch_size}")
        if not (np.isfinite(lr) and lr > 0):
            raise InvalidParameterError(f"lr must be > 0, got {lr}")
        if optimizer not in OPTIMIZERS:
            raise InvalidParameterError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if not 0.0 <= momentum < 1.0:
            raise InvalidParameterError(f"momentum must be in [0, 1), got {momentum}")
        if optimizer == "adam" and momentum:
            raise InvalidParameterError("momentum applies to optimizer='sgd' (Adam has its betas)")
        if not (np.isfinite(weight_decay) and weight_decay >= 0):
            raise InvalidParameterError(f"weight_decay must be >= 0, got {weight_decay}")
        if not (np.isfinite(prox_mu) and prox_mu >= 0):
            raise InvalidParameterError(f"prox_mu must be >= 0, got {prox_mu}")
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr
        self.optimizer, self.momentum, self.weight_decay = optimizer, momentum, weight_decay
        self.prox_mu = prox_mu
        self.loss = loss or default_loss

    def _optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                               weight_decay=self.weight_decay)

    def train(self, model: nn.Module, data: ArrayDataset, *, rng: np.random.Generator) -> float:
        model.train()
        x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
        params = [p for p in model.parameters() if p.requires_grad]
        anchor = [p.detach().clone() for p in params] if self.prox_mu else []
        optimizer = self._optimizer(params)
        total, count = 0.0, 0
        for _ in range(self.epochs):
            for index in batches(len(data), self.batch_size, rng):
                idx = torch.from_numpy(index)
                losses = self.loss(model(x[idx]), y[idx])
                if losses.dim() != 1 or losses.shape[0] != index.size:
                    raise InvalidParameterError(
                        f"the loss must return one value per example (shape [{index.size}]), "
                        f"got shape {list(losses.shape)}")
                loss = losses.mean()
                objective = loss
                if self.prox_mu:
                    objective = loss + self.prox_mu / 2 * sum(
                        ((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))
                optimizer.zero_grad(set_to_none=True)
                objective.backward()
                optimizer.step()
                total += loss.item() * index.size
                count += index.size
        return total / count
