"""Base learners of component-wise boosting: a linear term and a P-spline per feature.

A base learner maps the feature matrix to a design matrix B (n x K) and has a penalty matrix P
(K x K). Its fit to pseudo-residuals u is beta = (B'B + lambda P)^+ B'u, and both B'B and B'u are
sums over samples, so the federation can sum them across clients through the aggregation seam.

P-splines (Eilers & Marx 1996): cubic B-splines on equidistant knots with a second-order
difference penalty, lambda chosen so that the learner has a fixed number of degrees of freedom
df = trace((B'B + lambda P)^+ B'B). The knots must be public, so they are fixed by a public range
[-spline_range, spline_range] of the *standardised* feature (fedsec's federated standardisation
gives every party the same scale); values outside it are clamped to the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError

DF_TOLERANCE = 1e-8
"""Bisection on log(lambda) stops when df(lambda) is this close to the target."""


def bspline_design(x: np.ndarray, *, low: float, high: float, inner_knots: int, degree: int
                   ) -> np.ndarray:
    """B-spline basis (n x (inner_knots + degree + 1)) on equidistant knots over [low, high].

    Cox-de Boor recursion, vectorised over samples; ``x`` is clamped to [low, high] first, and
    ``x == high`` belongs to the last interval. Each row sums to 1.
    """
    segments = inner_knots + 1
    width = (high - low) / segments
    z = np.clip(np.asarray(x, dtype=np.float64), low, high)
    knots = low + width * (np.arange(segments + 2 * degree + 1) - degree)
    interval = np.minimum(np.floor((z - low) / width).astype(np.int64), segments - 1) + degree
    basis = np.zeros((z.size, knots.size - 1))
    basis[np.arange(z.size), interval] = 1.0
    for d in range(1, degree + 1):
        left = (z[:, None] - knots[None, : -d - 1]) / (d * width)
        right = (knots[None, d + 1:] - z[:, None]) / (d * width)
        basis = left * basis[:, :-1] + right * basis[:, 1:]
    return basis


def difference_penalty(size: int, order: int) -> np.ndarray:
    """P = D'D with D the ``order``-th difference matrix of a ``size``-vector."""
    d = np.diff(np.eye(size), n=order, axis=0)
    return d.T @ d


def lambda_for_df(gram: np.ndarray, penalty: np.ndarray, df: float) -> float:
    """The lambda >= 0 at which trace((G + lambda P)^+ G) equals ``df`` (bisection on log lambda).

    Returns 0 when the unpenalised fit has at most ``df`` degrees of freedom. Raises
    InvalidParameterError when df is below what no lambda reaches (the penalty's null space).
    """

    def trace(lam: float) -> float:
        return float(np.trace(np.linalg.pinv(gram + lam * penalty) @ gram))

    if trace(0.0) <= df + DF_TOLERANCE:
        return 0.0
    scale = max(float(np.trace(gram)) / max(float(np.trace(penalty)), 1e-300), 1e-300)
    lo, hi = np.log(scale) - 30.0, np.log(scale) + 30.0
    if trace(float(np.exp(hi))) > df:
        raise InvalidParameterError(f"boosting df = {df} is below the penalty's null space")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        value = trace(float(np.exp(mid)))
        if abs(value - df) < DF_TOLERANCE:
            break
        if value > df:
            lo = mid
        else:
            hi = mid
    return float(np.exp(0.5 * (lo + hi)))


@dataclass(frozen=True)
class LinearLearner:
    """``beta_0 + beta_1 x_j`` (mboost's bols with intercept), unpenalised: 2 columns."""

    feature: int

    @property
    def name(self) -> str:
        return f"linear(x{self.feature})"

    @property
    def size(self) -> int:
        return 2

    def design(self, x: np.ndarray) -> np.ndarray:
        column = np.asarray(x[:, self.feature], dtype=np.float64)
        return np.column_stack([np.ones_like(column), column])

    def penalty(self) -> np.ndarray:
        return np.zeros((2, 2))

    def df(self) -> float | None:
        return None


@dataclass(frozen=True)
class PSplineLearner:
    """A P-spline of feature ``feature`` (mboost's bbs): B-splines of ``degree`` on ``inner_knots``
    equidistant inner knots over the public range [-spline_range, spline_range], ``difference``-th
    order difference penalty, ``target_df`` degrees of freedom."""

    feature: int
    inner_knots: int
    degree: int
    difference: int
    target_df: float
    spline_range: float

    @property
    def name(self) -> str:
        return f"pspline(x{self.feature})"

    @property
    def size(self) -> int:
        return self.inner_knots + self.degree + 1

    def design(self, x: np.ndarray) -> np.ndarray:
        return bspline_design(x[:, self.feature], low=-self.spline_range, high=self.spline_range,
                              inner_knots=self.inner_knots, degree=self.degree)

    def penalty(self) -> np.ndarray:
        return difference_penalty(self.size, self.difference)

    def df(self) -> float | None:
        return self.target_df


BaseLearner = LinearLearner | PSplineLearner
