"""Losses in primal-dual form for L2-regularised linear models (SDCA, CoCoA, MOCHA).

Convention (Shalev-Shwartz & Zhang 2013, Jaggi et al. 2014): labels y in {-1, +1}, margins
z = y * w.x, and one dual variable alpha_i in [0, 1] per sample with the primal-dual map
w = (1 / (lambda n)) sum_i alpha_i y_i x_i. A loss provides

- ``primal(z)``: l(z) per sample;
- ``dual(alpha)``: -l*(-alpha) per sample (the dual objective's separable part);
- ``maximize(alpha, m, q)``: the exact maximiser of one SDCA coordinate problem
  ``a -> dual(a) - (a - alpha) m - q (a - alpha)^2 / 2`` over a in [0, 1] (scalars, q > 0: SDCA
  steps are sequential, so plain floats are faster here than numpy).

Both losses are privacy-agnostic maths; nothing here knows who holds which sample.
"""

from __future__ import annotations

import math

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError
from scipy.special import xlogy

LOSSES = ("hinge", "logistic")
NEWTON_ITERATIONS = 60
NEWTON_TOL = 1e-13


class HingeLoss:
    """l(z) = max(0, 1 - z) (linear SVM); -l*(-a) = a on [0, 1]; the coordinate step is closed form."""

    name = "hinge"

    @staticmethod
    def primal(z: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, 1.0 - z)

    @staticmethod
    def dual(alpha: np.ndarray) -> np.ndarray:
        return np.asarray(alpha, dtype=np.float64)

    @staticmethod
    def maximize(alpha: float, m: float, q: float) -> float:
        return min(1.0, max(0.0, alpha + (1.0 - m) / q))


class LogisticLoss:
    """l(z) = log(1 + exp(-z)); -l*(-a) = -a log a - (1 - a) log(1 - a) (binary entropy, nats).

    The coordinate maximiser solves ``log((1 - a) / a) = m + q (a - alpha)``; in u = logit(a) the
    left side minus the right is strictly decreasing with slope in [-1 - q/4, -1], and its root lies in
    [-m - q (1 - alpha), -m + q alpha]: bracketed Newton steps converge to machine precision.
    """

    name = "logistic"

    @staticmethod
    def primal(z: np.ndarray) -> np.ndarray:
        return np.logaddexp(0.0, -np.asarray(z, dtype=np.float64))

    @staticmethod
    def dual(alpha: np.ndarray) -> np.ndarray:
        a = np.asarray(alpha, dtype=np.float64)
        return -xlogy(a, a) - xlogy(1.0 - a, 1.0 - a)

    @staticmethod
    def maximize(alpha: float, m: float, q: float) -> float:
        lo, hi = -m - q * (1.0 - alpha), -m + q * alpha
        u = 0.5 * (lo + hi)
        previous = hi - lo
        for _ in range(NEWTON_ITERATIONS):
            s = _sigmoid(u)
            g = -u - m - q * (s - alpha)
            if g > 0:
                lo = u
            else:
                hi = u
            step = u + g / (1.0 + q * s * (1.0 - s))
            # safeguarded Newton: a step outside the bracket, or one not half the size of the
            # one before (Newton cycling between the sigmoid's flat tails), bisects instead
            if lo < step < hi and abs(step - u) <= 0.5 * previous:
                new = step
            else:
                new = 0.5 * (lo + hi)
            previous = abs(new - u)
            done = previous <= NEWTON_TOL * (1.0 + abs(u))
            u = new
            if done or hi - lo <= NEWTON_TOL * (1.0 + abs(u)):
                break
        return _sigmoid(u)


def _sigmoid(u: float) -> float:
    if u >= 0:
        return 1.0 / (1.0 + math.exp(-u))
    e = math.exp(u)
    return e / (1.0 + e)


def make_loss(name: str) -> HingeLoss | LogisticLoss:
    """The loss called ``name`` (one of :data:`LOSSES`)."""
    if name == "hinge":
        return HingeLoss()
    if name == "logistic":
        return LogisticLoss()
    raise InvalidParameterError(f"loss must be one of {LOSSES}, got {name!r}")


def signed_labels(y: np.ndarray) -> np.ndarray:
    """Binary labels {0, 1} (or {-1, +1}) as float64 {-1, +1}; anything else is a ValueError."""
    y = np.asarray(y)
    values = set(np.unique(y).tolist())
    if values <= {0, 1}:
        return np.where(y == 1, 1.0, -1.0)
    if values <= {-1, 1}:
        return y.astype(np.float64)
    raise InvalidParameterError(f"labels must be binary (0/1 or -1/+1), got values {sorted(values)[:5]}")


def with_intercept(x: np.ndarray) -> np.ndarray:
    """Samples flattened to (n, d) float64 with a constant 1 appended (a regularised intercept)."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    return np.hstack([flat, np.ones((flat.shape[0], 1))])
