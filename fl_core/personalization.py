"""Personalised federated learning: Ditto's regularised personal models and Per-FedAvg.

Both talk to the privacy layers only through the seam: what crosses it is a FedAvg-style model
delta whose weighted sum the protocol returns.

- :class:`Ditto` (Li et al. 2021; the L2GD-style regularised mixture of Hanzely and Richtarik
  2020 with the global model as the anchor): the global model w is trained by an inner strategy
  (FedAvg) through the seam; every client also keeps a personal model v_k that minimises
  f_k(v) + (lam / 2) ||v - w||^2 by proximal SGD against the global model of the round. v_k never
  leaves the client. lam = 0 is local training, lam = inf is the global model itself.
- :class:`PerFedAvg` (Fallah et al. 2020, first-order): the global model is trained so that a few
  local SGD steps of size alpha adapt it well; :func:`adapt` is that adaptation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from fedsec.fl_core.client import LocalResult, Strategy, batches
from fedsec.fl_core.data import ArrayDataset, FederatedDataset, stratified_split
from fedsec.fl_core.errors import InvalidParameterError, NonFiniteError
from fedsec.fl_core.models import classification_loss, evaluate
from fedsec.fl_core.parameters import get_vector, set_vector
from torch import nn


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    loss = classification_loss(model(x), y)
    return list(torch.autograd.grad(loss, _params(model))), float(loss.item())


def prox_sgd(model: nn.Module, start: np.ndarray, anchor: np.ndarray, data: ArrayDataset, *,
             lam: float, lr: float, epochs: int, batch_size: int,
             rng: np.random.Generator) -> np.ndarray:
    """Proximal SGD on f_k(v) + (lam / 2) ||v - anchor||^2 from ``start``; returns v.

    Each minibatch step is the gradient step on the loss followed by the exact proximal step of
    the penalty: v <- (v - lr g + lr lam anchor) / (1 + lr lam). It is stable for every lam >= 0;
    lam = 0 is plain SGD and lam = inf returns ``anchor``. Batches as :func:`fl_core.client.batches`.
    """
    if math.isinf(lam):
        return anchor.astype(np.float32).copy()
    set_vector(model, start)
    model.train()
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    params = _params(model)
    shrink = 1.0 / (1.0 + lr * lam)
    pull = [torch.from_numpy(a.copy()) for a in _split(anchor, params)]
    for _ in range(epochs):
        for index in batches(len(data), batch_size, rng):
            idx = torch.from_numpy(index)
            grads, _ = _gradient(model, x[idx], y[idx])
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-lr)
                if lam:
                    torch._foreach_add_(params, pull, alpha=lr * lam)
                    torch._foreach_mul_(params, shrink)
    return get_vector(model)


def _split(vector: np.ndarray, params: Sequence[torch.Tensor]) -> list[np.ndarray]:
    out, offset = [], 0
    for p in params:
        out.append(vector[offset : offset + p.numel()].reshape(p.shape).astype(np.float32))
        offset += p.numel()
    return out


class Ditto(Strategy):
    """Ditto: the inner strategy trains the global model; each client also keeps a personal model.

    In each round a client first computes the inner strategy's update from the global model w
    (what it sends), then ``epochs`` epochs of :func:`prox_sgd` on its personal model towards w.
    The personal step draws from the client's generator after the inner update, so the global
    model follows exactly the trajectory of the inner strategy alone. A personal model starts as
    the global model of the client's first round. A personal step that is not finite leaves the
    personal model as it was (``personal_failures`` counts them); it never affects the round.

    Personal models are kept per client data set (the object stands for the client's device);
    read them with :meth:`personal_vector`.

    Args:
        inner: the strategy of the global model (FedAvg, with a DP-SGD trainer if private).
        lam: the penalty lam in [0, inf] (0 = local training, inf = the global model).
        lr: personal learning rate, > 0.
        epochs: personal epochs per round, >= 1.
        batch_size: personal batch size B >= 0 (0 = full batch).
    """

    def __init__(self, *, inner: Strategy, lam: float, lr: float, epochs: int = 1,
                 batch_size: int = 0) -> None:
        if not lam >= 0:
            raise InvalidParameterError(f"lam must be >= 0 (inf allowed), got {lam}")
        if not (math.isfinite(lr) and lr > 0):
            raise InvalidParameterError(f"lr must be > 0, got {lr}")
        if epochs < 1:
            raise InvalidParameterError(f"epochs must be >= 1, got {epochs}")
        if batch_size < 0:
            raise InvalidParameterError(f"batch_size must be >= 0 (0 = full batch), got {batch_size}")
        self.inner, self.lam, self.lr, self.epochs, self.batch_size = inner, lam, lr, epochs, batch_size
        self.name = "ditto"
        self.personal_failures = 0
        self._personal: dict[int, tuple[ArrayDataset, np.ndarray]] = {}

    def client_update(self, model: nn.Module, global_vector: np.ndarray, data: ArrayDataset, *,
                      rng: np.random.Generator) -> LocalResult:
        result = self.inner.client_update(model, global_vector, data, rng=rng)
        start = self._personal.get(id(data), (data, global_vector))[1]
        personal = prox_sgd(model, start, global_vector, data, lam=self.lam, lr=self.lr,
                            epochs=self.epochs, batch_size=self.batch_size, rng=rng)
        if np.isfinite(personal).all():
            self._personal[id(data)] = (data, personal.astype(np.float32))
        else:
            self.personal_failures += 1
            self._personal.setdefault(id(data), (data, global_vector.astype(np.float32).copy()))
        return result

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        return self.inner.apply(global_vector, average)

    def personal_vector(self, data: ArrayDataset) -> np.ndarray | None:
        """The personal model of the client holding ``data``; None if it never took part."""
        entry = self._personal.get(id(data))
        return None if entry is None or entry[0] is not data else entry[1].copy()


def _batch(n: int, batch_size: int, rng: np.random.Generator) -> torch.Tensor:
    if batch_size == 0 or batch_size >= n:
        return torch.arange(n)
    return torch.from_numpy(np.sort(rng.choice(n, size=batch_size, replace=False)))


class PerFedAvg(Strategy):
    """Per-FedAvg, first-order (Fallah, Mokhtari and Ozdaglar 2020): clients send w_k - w.

    Each of ``local_steps`` steps draws two independent minibatches D, D' of size
    ``batch_size`` and sets theta' = theta - alpha grad f(theta; D), then
    theta <- theta - beta grad f(theta'; D') (the MAML step with the Hessian term dropped). The
    server adds the weighted average delta to w. A client personalises with :func:`adapt`.

    Args:
        alpha: inner (adaptation) step size, > 0.
        beta: outer (meta) step size, > 0.
        local_steps: meta steps per round, >= 1.
        batch_size: size of D and D', >= 0 (0 = the full local batch for both).
        weighting: ``samples`` (n_k) or ``equal`` (1).
    """

    name = "perfedavg"
    WEIGHTINGS = ("samples", "equal")

    def __init__(self, *, alpha: float, beta: float, local_steps: int, batch_size: int,
                 weighting: str = "samples") -> None:
        for key, value in (("alpha", alpha), ("beta", beta)):
            if not (math.isfinite(value) and value > 0):
                raise InvalidParameterError(f"{key} must be > 0, got {value}")
        if local_steps < 1:
            raise InvalidParameterError(f"local_steps must be >= 1, got {local_steps}")
        if batch_size < 0:
            raise InvalidParameterError(f"batch_size must be >= 0 (0 = full batch), got {batch_size}")
        if weighting not in self.WEIGHTINGS:
            raise InvalidParameterError(f"weighting must be one of {self.WEIGHTINGS}, got {weighting!r}")
        self.alpha, self.beta, self.local_steps = alpha, beta, local_steps
        self.batch_size, self.weighting = batch_size, weighting

    def client_update(self, model: nn.Module, global_vector: np.ndarray, data: ArrayDataset, *,
                      rng: np.random.Generator) -> LocalResult:
        set_vector(model, global_vector)
        model.train()
        x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
        params = _params(model)
        total = 0.0
        for _ in range(self.local_steps):
            inner_batch = _batch(len(data), self.batch_size, rng)
            outer_batch = _batch(len(data), self.batch_size, rng)
            theta = [p.detach().clone() for p in params]
            grads, _ = _gradient(model, x[inner_batch], y[inner_batch])
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-self.alpha)
            grads, loss = _gradient(model, x[outer_batch], y[outer_batch])
            total += loss
            with torch.no_grad():
                for p, t, g in zip(params, theta, grads, strict=True):
                    p.copy_(t - self.beta * g)
        delta = get_vector(model) - global_vector
        if not np.isfinite(delta).all():
            raise NonFiniteError("local model is not finite (learning rate too high?)")
        weight = 1.0 if self.weighting == "equal" else float(len(data))
        return LocalResult(delta, weight, total / self.local_steps)

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        return (global_vector + average).astype(np.float32)


def adapt(model: nn.Module, vector: np.ndarray, data: ArrayDataset, *, alpha: float, steps: int,
          batch_size: int = 0, rng: np.random.Generator) -> np.ndarray:
    """``steps`` SGD steps of size ``alpha`` from ``vector`` on ``data`` (Per-FedAvg's
    personalisation; batch_size 0 = full-batch gradient steps). Returns the adapted vector."""
    set_vector(model, vector)
    model.train()
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    params = _params(model)
    for _ in range(steps):
        index = _batch(len(data), batch_size, rng)
        grads, _ = _gradient(model, x[index], y[index])
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-alpha)
    return get_vector(model)


def split_local(data: FederatedDataset, *, holdout: float, rng: np.random.Generator
                ) -> tuple[FederatedDataset, tuple[ArrayDataset, ...]]:
    """Hold out a stratified share ``holdout`` in (0, 1) of every client's data as its local test
    set. Returns the data set of the remaining training parts and the local test sets."""
    if not 0.0 < holdout < 1.0:
        raise InvalidParameterError(f"holdout must be in (0, 1), got {holdout}")
    trains, tests = [], []
    for k, client in enumerate(data.clients):
        train, test = stratified_split(client.y, test_fraction=holdout, rng=rng)
        if test.size == 0 or train.size == 0:
            raise InvalidParameterError(f"client {k} has too few samples ({len(client)}) to hold "
                                        f"out a local test set")
        trains.append(client.subset(train))
        tests.append(client.subset(test))
    return (FederatedDataset(name=data.name, clients=tuple(trains), test=data.test,
                             n_classes=data.n_classes, input_shape=data.input_shape,
                             standardize=data.standardize, info=data.info), tuple(tests))


def per_client_accuracy(model: nn.Module, vectors: Sequence[np.ndarray],
                        tests: Sequence[ArrayDataset]) -> np.ndarray:
    """Accuracy in [0, 1] of model ``vectors[k]`` on ``tests[k]``, per client."""
    scores = []
    for vector, test in zip(vectors, tests, strict=True):
        set_vector(model, vector)
        scores.append(evaluate(model, test.x, test.y)[0])
    return np.array(scores)
