"""Server optimisers (Reddi et al. 2021, "Adaptive Federated Optimization").

They act on the released aggregate only: the weighted average of the clients' deltas is taken as
a pseudo-gradient with the sign of a descent step (Delta = average of w_k - w), so they compose
with any aggregation protocol and any privacy layer (post-processing of what was released).

- ``sgd``:       w <- w + lr Delta (lr = 1: plain model averaging)
- ``momentum``:  m <- beta m + Delta;  w <- w + lr m  (FedAvgM, Hsu et al. 2019)
- ``adam``:      m <- b1 m + (1 - b1) Delta;  v <- b2 v + (1 - b2) Delta^2;  w <- w + lr m / (sqrt v + tau)
- ``yogi``:      as adam but v <- v - (1 - b2) Delta^2 sign(v - Delta^2)

Reddi et al.'s FedAdam/FedYogi use no bias correction; neither do these. State is float64.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi")
DEFAULT_SERVER_LR = {"sgd": 1.0, "momentum": 1.0, "adam": 0.01, "yogi": 0.01}
"""lr used when none is given (Reddi et al. tune FedAdam/FedYogi around 1e-2)."""


def _check(name: str, value: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = float(value)
    inside = (low < value if open_low else low <= value) and value < high
    if not (math.isfinite(value) and inside):
        bracket = "(" if open_low else "["
        raise InvalidParameterError(f"{name} must be in {bracket}{low:g}, {high:g}), got {value}")
    return value


class ServerOptimizer(ABC):
    """Turns the released average delta into the next global vector; may keep state."""

    name = "abstract"

    @abstractmethod
    def step(self, vector: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """The next float32 global vector from the current one and the average delta."""


class ServerSGD(ServerOptimizer):
    """w <- w + lr Delta. Args: lr > 0."""

    name = "sgd"

    def __init__(self, *, lr: float = 1.0) -> None:
        self.lr = _check("server_lr", lr, 0.0, math.inf, open_low=True)

    def step(self, vector: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return (vector.astype(np.float64) + self.lr * delta).astype(np.float32)


class ServerMomentum(ServerOptimizer):
    """Server momentum (FedAvgM). Args: lr > 0, momentum beta in [0, 1)."""

    name = "momentum"

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.9) -> None:
        self.lr = _check("server_lr", lr, 0.0, math.inf, open_low=True)
        self.momentum = _check("server_momentum", momentum, 0.0, 1.0)
        self.m: np.ndarray | None = None

    def step(self, vector: np.ndarray, delta: np.ndarray) -> np.ndarray:
        d = delta.astype(np.float64)
        self.m = d if self.m is None else self.momentum * self.m + d
        return (vector.astype(np.float64) + self.lr * self.m).astype(np.float32)


class ServerAdam(ServerOptimizer):
    """FedAdam. Args: lr > 0, beta1 and beta2 in [0, 1), tau > 0 (adaptivity, 1e-3 by default)."""

    name = "adam"

    def __init__(self, *, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3) -> None:
        self.lr = _check("server_lr", lr, 0.0, math.inf, open_low=True)
        self.beta1 = _check("beta1", beta1, 0.0, 1.0)
        self.beta2 = _check("beta2", beta2, 0.0, 1.0)
        self.tau = _check("tau", tau, 0.0, math.inf, open_low=True)
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return self.beta2 * v + (1 - self.beta2) * d2

    def step(self, vector: np.ndarray, delta: np.ndarray) -> np.ndarray:
        d = delta.astype(np.float64)
        if self.m is None or self.v is None:
            self.m, self.v = np.zeros_like(d), np.full_like(d, self.tau ** 2)
        self.m = self.beta1 * self.m + (1 - self.beta1) * d
        self.v = self._second_moment(self.v, d * d)
        return (vector.astype(np.float64) + self.lr * self.m / (np.sqrt(self.v) + self.tau)
                ).astype(np.float32)


class ServerYogi(ServerAdam):
    """FedYogi: Adam with the additive second-moment update of Zaheer et al. 2018."""

    name = "yogi"

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v - (1 - self.beta2) * d2 * np.sign(v - d2)


def make_server_optimizer(name: str, *, lr: float | None = None, momentum: float = 0.9
                          ) -> ServerOptimizer:
    """The server optimiser called ``name`` (one of ``SERVER_OPTIMIZERS``); ``lr`` None picks
    ``DEFAULT_SERVER_LR[name]``."""
    if name not in SERVER_OPTIMIZERS:
        raise InvalidParameterError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {name!r}")
    rate = DEFAULT_SERVER_LR[name] if lr is None else lr
    if name == "sgd":
        return ServerSGD(lr=rate)
    if name == "momentum":
        return ServerMomentum(lr=rate, momentum=momentum)
    return ServerAdam(lr=rate) if name == "adam" else ServerYogi(lr=rate)
