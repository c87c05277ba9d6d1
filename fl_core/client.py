"""Client-side work: local trainers and the strategies that turn local work into an update.

A :class:`LocalTrainer` trains a model in place on one client's data (plain SGD here; DP-SGD
is another trainer, written outside ``fl_core``). A :class:`Strategy` decides what a client
sends (FedAvg: the model delta; FedSGD: the gradient) and how the server applies the average.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import InvalidParameterError, NonFiniteError
from fedsec.fl_core.models import classification_loss
from fedsec.fl_core.parameters import get_vector, set_vector
from fedsec.fl_core.server_optimizers import ServerOptimizer
from torch import nn


@dataclass(frozen=True)
class LocalResult:
    """A client's output for one round.

    Attributes:
        vector: the float32 update it contributes (a delta or a gradient).
        weight: its weight in the average: n_k, its number of training samples, or 1 when the
            strategy weights clients equally.
        loss: its mean training loss this round, or None when its trainer does not release one.
    """

    vector: np.ndarray
    weight: float
    loss: float | None


class LocalTrainer(ABC):
    """Trains ``model`` in place on one client's data and returns the mean training loss, or None
    when the trainer does not release it (the client then reports no loss)."""

    @abstractmethod
    def train(self, model: nn.Module, data: ArrayDataset, *, rng: np.random.Generator
              ) -> float | None:
        """Run local training; all shuffling draws from ``rng``."""


def batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Index batches of one shuffled epoch over ``n`` samples; ``batch_size`` 0 = one full batch."""
    order = rng.permutation(n)
    if batch_size == 0 or batch_size >= n:
        return [order]
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


class SGDTrainer(LocalTrainer):
    """Plain minibatch SGD.

    Args:
        epochs: E, full passes over the local data, >= 1.
        batch_size: B >= 0; 0 means the full local batch (one step per epoch).
        lr: learning rate, > 0.
    """

    def __init__(self, *, epochs: int, batch_size: int, lr: float) -> None:
        if epochs < 1:
            raise InvalidParameterError(f"local_epochs must be >= 1, got {epochs}")
        if batch_size < 0:
            raise InvalidParameterError(f"batch_size must be >= 0 (0 = full batch), got {batch_size}")
        if not lr > 0:
            raise InvalidParameterError(f"lr must be > 0, got {lr}")
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr

    def train(self, model: nn.Module, data: ArrayDataset, *, rng: np.random.Generator) -> float:
        model.train()
        x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
        params = [p for p in model.parameters() if p.requires_grad]
        total, count = 0.0, 0
        for _ in range(self.epochs):
            for index in batches(len(data), self.batch_size, rng):
                idx = torch.from_numpy(index)
                loss = classification_loss(model(x[idx]), y[idx])
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    torch._foreach_add_(params, grads, alpha=-self.lr)
                total += loss.item() * index.size
                count += index.size
        return total / count


class Strategy(ABC):
    """What clients send and how the server applies the weighted average of it."""

    name: str = "abstract"

    @abstractmethod
    def client_update(
        self,
        model: nn.Module,
        global_vector: np.ndarray,
        data: ArrayDataset,
        *,
        rng: np.random.Generator,
    ) -> LocalResult:
        """Compute one client's contribution starting from ``global_vector``."""

    @abstractmethod
    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        """Return the next global vector from the current one and the weighted average update."""


def _finite(vector: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(vector).all():
        raise NonFiniteError(f"{what} is not finite (learning rate too high?)")
    return vector


class FedAvg(Strategy):
    """Federated averaging (McMahan et al. 2017): clients train locally and send w_k - w.

    Args:
        trainer: the local trainer (E epochs of SGD, or DP-SGD from a privacy layer).
        server_lr: step applied to the averaged delta, > 0 (1 = plain model averaging).
        weighting: ``samples`` (weight n_k, McMahan et al.) or ``equal`` (weight 1 for every
            client, so nothing the client sends depends on its size).
        server_optimizer: what turns the averaged delta into the next model (see
            :mod:`fl_core.server_optimizers`); None = SGD with ``server_lr``.
    """

    name = "fedavg"
    WEIGHTINGS = ("samples", "equal")

    def __init__(self, *, trainer: LocalTrainer, server_lr: float = 1.0,
                 weighting: str = "samples", server_optimizer: ServerOptimizer | None = None) -> None:
        if not server_lr > 0:
            raise InvalidParameterError(f"server_lr must be > 0, got {server_lr}")
        if weighting not in self.WEIGHTINGS:
            raise InvalidParameterError(f"weighting must be one of {self.WEIGHTINGS}, got {weighting!r}")
        if server_optimizer is not None and server_lr != 1.0:
            raise InvalidParameterError("give server_lr to the server_optimizer, not to FedAvg")
        self.trainer, self.server_lr, self.weighting = trainer, server_lr, weighting
        self.server_optimizer = server_optimizer

    def client_update(
        self,
        model: nn.Module,
        global_vector: np.ndarray,
        data: ArrayDataset,
        *,
        rng: np.random.Generator,
    ) -> LocalResult:
        set_vector(model, global_vector)
        loss = self.trainer.train(model, data, rng=rng)
        delta = _finite(get_vector(model) - global_vector, "local model")
        return LocalResult(delta, 1.0 if self.weighting == "equal" else float(len(data)), loss)

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        if self.server_optimizer is not None:
            return self.server_optimizer.step(global_vector, average)
        return (global_vector + np.float32(self.server_lr) * average).astype(np.float32)


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): FedAvg whose clients minimise loss + (mu / 2) ||w - w_global||^2.

    Args:
        trainer: a trainer with a proximal term (``prox_mu`` attribute, e.g.
            :class:`fl_core.local.TorchTrainer`), whose ``prox_mu`` must be > 0.
        server_lr, weighting, server_optimizer: as for :class:`FedAvg`.
    """

    name = "fedprox"

    def __init__(self, *, trainer: LocalTrainer, server_lr: float = 1.0, weighting: str = "samples",
                 server_optimizer: ServerOptimizer | None = None) -> None:
        mu = getattr(trainer, "prox_mu", None)
        if mu is None:
            raise InvalidParameterError(
                f"FedProx needs a local trainer with a proximal term; {type(trainer).__name__} "
                "has none")
        if not mu > 0:
            raise InvalidParameterError(f"FedProx needs prox_mu > 0, got {mu}")
        super().__init__(trainer=trainer, server_lr=server_lr, weighting=weighting,
                         server_optimizer=server_optimizer)
        self.mu = float(mu)


class FedSGD(Strategy):
    """Federated SGD: each client sends its full-batch gradient; the server takes one step.

    Args:
        lr: server learning rate, > 0.
    """

    name = "fedsgd"

    def __init__(self, *, lr: float) -> None:
        if not lr > 0:
            raise InvalidParameterError(f"lr must be > 0, got {lr}")
        self.lr = lr

    def client_update(
        self,
        model: nn.Module,
        global_vector: np.ndarray,
        data: ArrayDataset,
        *,
        rng: np.random.Generator,
    ) -> LocalResult:
        set_vector(model, global_vector)
        model.train()
        model.zero_grad(set_to_none=True)
        loss = classification_loss(model(torch.from_numpy(data.x)), torch.from_numpy(data.y))
        loss.backward()
        grads = [p.grad.reshape(-1) for p in model.parameters()]
        gradient = torch.cat(grads).detach().numpy().astype(np.float32)
        return LocalResult(_finite(gradient, "local gradient"), float(len(data)), loss.item())

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        return (global_vector - np.float32(self.lr) * average).astype(np.float32)


class ZeroOnFailure(Strategy):
    """Wraps a strategy so that a client whose local result is not finite sends a zero update
    (with its usual weight and no loss) instead of dropping out of the round.

    The server then cannot tell a failed client from one whose update happens to be zero; under a
    layer that clips and noises every update whatever it is (client-level DP), the failure is
    covered like any other property of the client's data.

    Args:
        inner: the strategy whose updates are sent.
    """

    def __init__(self, inner: Strategy) -> None:
        self.inner, self.name = inner, inner.name

    def client_update(
        self,
        model: nn.Module,
        global_vector: np.ndarray,
        data: ArrayDataset,
        *,
        rng: np.random.Generator,
    ) -> LocalResult:
        try:
            return self.inner.client_update(model, global_vector, data, rng=rng)
        except NonFiniteError:
            equal = getattr(self.inner, "weighting", "samples") == "equal"
            return LocalResult(np.zeros_like(global_vector, dtype=np.float32),
                               1.0 if equal else float(len(data)), None)

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        return self.inner.apply(global_vector, average)
