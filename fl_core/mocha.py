"""MOCHA: federated multi-task learning with a learned task relationship (Smith et al. 2017).

One linear model w_t per client (task) t = 1..m, columns of W (d x m, last row: intercepts):

    P(W, Omega) = (1/n) sum_t sum_{i in t} l(y_i w_t.x_i) + (lambda/2) tr(W Omega W^T),

with Sigma = Omega^{-1} the task covariance. For fixed Sigma the dual, with one alpha_i in [0, 1] per
sample and v_t = (1/n) sum_{i in t} alpha_i y_i x_i (V = [v_1 .. v_m]), is

    D(alpha) = (1/n) sum_i -l*(-alpha_i) - (1/(2 lambda)) tr(V Sigma V^T),   W(alpha) = V Sigma / lambda,

so the duality gap is (1/n) sum_i [l_i + l*_i(-alpha_i)] + tr(V Sigma V^T) / lambda.

A round: the server sends client t its w_t and Sigma_tt; the client runs up to H SDCA steps on its
block against the local subproblem with curvature sigma' Sigma_tt (exactly :func:`fl_core.cocoa.local_sdca`
with lambda / Sigma_tt), and returns Delta v_t. sigma' = lambda_max(D^{-1/2} Sigma D^{-1/2}), D = diag(Sigma),
is the smallest value with Sigma <= sigma' D, so adding every Delta v_t (gamma = 1) is safe.
Every ``omega_every`` rounds the server sets Sigma = (W^T W)^{1/2} / tr((W^T W)^{1/2}) (Zhang & Yeung
2010; eigenvalues floored at ``EIGEN_FLOOR`` times the largest, so Omega exists).

Stragglers: in each round each client, with probability ``straggle``, does a uniformly drawn
number of steps in [0, H) (0 = it skips the round: a theta-approximate solve with theta = 1).
The server uses whatever arrives; the dual stays consistent because each client applies exactly the
Delta alpha it reported.

Where this is NOT a sum: the server forms W = V Sigma / lambda and W^T W from the INDIVIDUAL v_t, so
every client's model is revealed to the server. MOCHA runs with plain aggregation only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from fedsec.fl_core.cocoa import local_sdca
from fedsec.fl_core.duality import make_loss, signed_labels, with_intercept
from fedsec.fl_core.errors import InvalidParameterError

EIGEN_FLOOR = 1e-6


def task_covariance(w: np.ndarray) -> np.ndarray:
    """Sigma = (W^T W)^{1/2} / tr((W^T W)^{1/2}) for W of shape (d, m); positive definite, trace 1."""
    values, vectors = np.linalg.eigh(w.T @ w)
    root = np.sqrt(np.maximum(values, 0.0))
    root = np.maximum(root, EIGEN_FLOOR * max(float(root.max()), 1e-300))
    sigma = (vectors * root) @ vectors.T
    return sigma / np.trace(sigma)


def _check_sigma(sigma: np.ndarray, m: int) -> np.ndarray:
    if sigma.shape != (m, m) or not np.allclose(sigma, sigma.T) or np.linalg.eigvalsh(sigma)[0] <= 0:
        raise InvalidParameterError(f"sigma must be a symmetric positive definite {m} x {m} matrix")
    return sigma


def safe_sigma_prime(sigma: np.ndarray) -> float:
    """lambda_max(D^{-1/2} Sigma D^{-1/2}): the smallest sigma' with Sigma <= sigma' diag(Sigma)."""
    d = 1.0 / np.sqrt(np.diag(sigma))
    return float(np.linalg.eigvalsh(sigma * np.outer(d, d))[-1])


class MochaClient:
    """One task: its data, its dual block, its local solver.

    Args:
        client_id: index t of the task (column of W).
        x: samples, first axis n_t (an intercept column is appended).
        y: binary labels 0/1 or -1/+1.
    """

    def __init__(self, *, client_id: int, x: np.ndarray, y: np.ndarray) -> None:
        if len(x) != len(y) or len(y) < 1:
            raise InvalidParameterError(f"client {client_id}: x and y must have the same length >= 1")
        self.client_id = client_id
        self.x = with_intercept(x)
        self.y = signed_labels(y)
        self.alpha = np.zeros(len(y))

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def local_update(self, w_t: np.ndarray, *, sigma_tt: float, lam: float, n_total: int,
                     sigma_prime: float, loss: str, steps: int, rng: np.random.Generator) -> np.ndarray:
        """Run ``steps`` SDCA steps, apply Delta alpha, return Delta v_t (shape (d,))."""
        if steps == 0:
            return np.zeros_like(w_t)
        delta_alpha, delta_w = local_sdca(self.x, self.y, self.alpha, w_t, loss_name=loss,
                                          lam=lam / sigma_tt, n_total=n_total, sigma_prime=sigma_prime,
                                          steps=steps, rng=rng)
        self.alpha = self.alpha + delta_alpha
        return delta_w * (lam / sigma_tt)

    def gap_terms(self, w_t: np.ndarray, loss: str) -> tuple[float, float]:
        """Sums over this task's samples of l(y w_t.x) and -l*(-alpha)."""
        f = make_loss(loss)
        return float(f.primal(self.y * (self.x @ w_t)).sum()), float(f.dual(self.alpha).sum())

    def accuracy(self, w_t: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Accuracy of the linear model w_t on held-out samples of this task."""
        return float(np.mean(np.sign(with_intercept(x) @ w_t) == signed_labels(y)))


@dataclass
class MochaRound:
    round: int
    primal: float
    dual: float
    gap: float
    steps: int
    skipped: int


@dataclass
class MochaResult:
    """W (d x m, column t = task t's model, last row intercepts), Sigma, and the rounds."""

    w: np.ndarray
    sigma: np.ndarray
    rounds: list[MochaRound] = field(default_factory=list)


class Mocha:
    """The MOCHA server loop (plain communication: see the module docstring).

    Args:
        loss: ``hinge`` or ``logistic``.
        lam: lambda > 0.
        local_steps: H >= 1, the most SDCA steps a client does per round.
        omega_every: update Sigma every this many rounds; 0 = never (Sigma = I/m: local-only models).
        straggle: probability in [0, 1] that a client is a straggler in a round.
    """

    def __init__(self, *, loss: str = "hinge", lam: float = 1e-3, local_steps: int = 100,
                 omega_every: int = 5, straggle: float = 0.0) -> None:
        make_loss(loss)
        if not (np.isfinite(lam) and lam > 0):
            raise InvalidParameterError(f"lam must be a finite number > 0, got {lam}")
        if local_steps < 1:
            raise InvalidParameterError(f"local_steps must be >= 1, got {local_steps}")
        if omega_every < 0:
            raise InvalidParameterError(f"omega_every must be >= 0, got {omega_every}")
        if not 0.0 <= straggle <= 1.0:
            raise InvalidParameterError(f"straggle must be in [0, 1], got {straggle}")
        self.loss, self.lam, self.local_steps = loss, float(lam), int(local_steps)
        self.omega_every, self.straggle = int(omega_every), float(straggle)

    def fit(self, clients: Sequence[MochaClient], *, rounds: int, rng: np.random.Generator,
            sigma: np.ndarray | None = None,
            on_round: Callable[[MochaRound, np.ndarray], None] | None = None) -> MochaResult:
        """Run ``rounds`` rounds from Sigma = ``sigma`` (symmetric positive definite m x m; default
        I/m, unrelated tasks); ``on_round(record, W)`` after each."""
        m = len(clients)
        n_total = sum(c.n for c in clients)
        d = clients[0].x.shape[1]
        v = np.zeros((d, m))
        sigma = np.eye(m) / m if sigma is None else _check_sigma(np.asarray(sigma, dtype=np.float64), m)
        result = MochaResult(np.zeros((d, m)), sigma)
        for r in range(1, rounds + 1):
            w = v @ sigma / self.lam
            sigma_prime = safe_sigma_prime(sigma)
            steps = self._steps(m, rng)
            for t, client in enumerate(clients):
                v[:, t] += client.local_update(w[:, t], sigma_tt=float(sigma[t, t]), lam=self.lam,
                                               n_total=n_total, sigma_prime=sigma_prime, loss=self.loss,
                                               steps=int(steps[t]), rng=rng)
            if self.omega_every and r % self.omega_every == 0:
                sigma = task_covariance(v @ sigma / self.lam)
            w = v @ sigma / self.lam
            primal, dual = self._objectives(clients, v, w, sigma, n_total)
            record = MochaRound(r, primal, dual, primal - dual, int(steps.sum()), int((steps == 0).sum()))
            result.rounds.append(record)
            if on_round is not None:
                on_round(record, w)
        result.w, result.sigma = v @ sigma / self.lam, sigma
        return result

    def _steps(self, m: int, rng: np.random.Generator) -> np.ndarray:
        steps = np.full(m, self.local_steps)
        slow = rng.random(m) < self.straggle
        steps[slow] = rng.integers(0, self.local_steps, size=int(slow.sum()))
        return steps

    def _objectives(self, clients: Sequence[MochaClient], v: np.ndarray, w: np.ndarray,
                    sigma: np.ndarray, n_total: int) -> tuple[float, float]:
        terms = np.array([c.gap_terms(w[:, t], self.loss) for t, c in enumerate(clients)]).sum(axis=0)
        quadratic = float(np.trace(v @ sigma @ v.T)) / (2.0 * self.lam)
        return terms[0] / n_total + quadratic, terms[1] / n_total - quadratic
