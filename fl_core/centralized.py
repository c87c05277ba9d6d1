"""Centralised baselines to compare a federated model against."""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError


def logistic_mle(
    x: np.ndarray, y: np.ndarray, *, max_iter: int = 100, tol: float = 1e-10
) -> tuple[float, np.ndarray]:
    """Maximum-likelihood binary logistic regression by Newton's method (IRLS), in float64.

    Args:
        x: features, shape (n, p).
        y: labels in {0, 1}, shape (n,).
        max_iter: Newton steps at most, >= 1.
        tol: stop when the largest coefficient change falls below it.

    Returns:
        ``(intercept, theta)``, theta of shape (p,).
    """
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise InvalidParameterError(f"need x of shape (n, p) and y of shape (n,), got {x.shape}, {y.shape}")
    if not np.isin(y, (0, 1)).all():
        raise InvalidParameterError("labels must be 0 or 1")
    design = np.hstack([np.ones((x.shape[0], 1)), x.astype(np.float64)])
    beta = np.zeros(design.shape[1])
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-design @ beta))
        gradient = design.T @ (y - p)
        hessian = (design * (p * (1 - p))[:, None]).T @ design
        step = np.linalg.solve(hessian + 1e-12 * np.eye(beta.size), gradient)
        beta += step
        if np.abs(step).max() < tol:
            break
    return float(beta[0]), beta[1:]
