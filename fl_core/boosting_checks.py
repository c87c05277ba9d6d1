"""Consistency checks on the pooled boosting statistics: what the server can verify from sums alone.

Every B-spline row sums to 1 and every linear design has a column of ones, so several pooled
numbers must agree whatever the data: the sample count n equals a linear Gram's [0, 0] entry and
the sum of every spline Gram's entries; every Gram is positive semi-definite; and in every
iteration the pooled residual sum sum_i u_i equals a linear learner's first entry of B'u and the
sum of every spline learner's B'u. A client that lies inconsistently (a Gram that does not match
its count, residual sums that differ between learners, a negative loss, labels outside [0, 1])
breaks one of these and the fit stops with an AggregationError. A client that lies consistently,
as if it held other data, passes: that is data poisoning, which no check on a sum can tell from
honest data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from fedsec.fl_core.boosting_learners import BaseLearner, LinearLearner, PSplineLearner
from fedsec.fl_core.errors import AggregationError

RELATIVE_TOLERANCE = 1e-4
"""Disagreement allowed, in units of the pooled sample count n (quantisation is about 1e-7 n)."""

INCONSISTENT = "boosting statistics are inconsistent"
"""The one message of every failed check (which check failed would only help a liar tune)."""


def check_setup(learners: Sequence[BaseLearner], grams: Sequence[np.ndarray], n: float, sum_y: float,
                clients: int, family: str) -> None:
    """Raise AggregationError unless the pooled set-up sums could come from real data."""
    tol = RELATIVE_TOLERANCE * max(n, 1.0)
    ok = n >= clients and np.isfinite(sum_y)
    if family == "binomial":
        ok = ok and -tol <= sum_y <= n + tol
    for learner, gram in zip(learners, grams, strict=True):
        if not ok:
            break
        if isinstance(learner, LinearLearner):
            ok = abs(gram[0, 0] - n) <= tol
        elif isinstance(learner, PSplineLearner):
            ok = abs(gram.sum() - n) <= tol
        ok = ok and bool(np.isfinite(gram).all()) and np.linalg.eigvalsh(gram).min() >= -tol
    if not ok:
        raise AggregationError(INCONSISTENT)


def check_iteration(learners: Sequence[BaseLearner], cross: Sequence[np.ndarray], loss_sum: float,
                    n: float) -> None:
    """Raise AggregationError unless the pooled B'u of all learners agree on sum_i u_i and the
    pooled loss is a finite number >= 0."""
    tol = RELATIVE_TOLERANCE * max(n, 1.0)
    totals = [b[0] if isinstance(learner, LinearLearner) else b.sum()
              for learner, b in zip(learners, cross, strict=True)]
    finite = bool(np.isfinite(loss_sum)) and all(np.isfinite(b).all() for b in cross)
    if not finite or loss_sum < -tol or max(totals) - min(totals) > tol:
        raise AggregationError(INCONSISTENT)
