"""Byzantine-robust aggregation rules behind the seam.

Two kinds, by what they need to see:

- :class:`RobustAggregation` (coordinate-wise median, trimmed mean; Yin et al. 2018) needs every
  client's individual update: the server sees them in the clear, so it composes with no secure
  layer. Each accepted client counts once (weight 1): a Byzantine client could lie about n_k.
- :class:`NormBoundedAggregation` clips each update's L2 norm to a bound before the update
  enters the inner protocol. The clip happens where the client encodes its update, so it works
  under any inner protocol (masking, Paillier) whose output is a sum; it bounds what one
  poisoned update can move the average by ``bound * weight_k / total_weight``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from fedsec.fl_core.aggregation import (
    AggregateResult,
    AggregationProtocol,
    ClientUpdate,
    Purpose,
    screen_updates,
)
from fedsec.fl_core.errors import InvalidParameterError

RULES = ("median", "trimmed_mean")


def coordinate_median(vectors: np.ndarray) -> np.ndarray:
    """Coordinate-wise median of the rows of ``vectors`` (shape [n, d]), float64, shape [d]."""
    return np.median(np.asarray(vectors, dtype=np.float64), axis=0)


def trimmed_count(n: int, trim: float) -> int:
    """Rows cut from each end for a trim fraction ``trim`` in [0, 0.5) of ``n`` rows:
    floor(trim * n), lowered so that at least one row remains."""
    return min(int(math.floor(trim * n + 1e-9)), (n - 1) // 2)


def trimmed_mean(vectors: np.ndarray, trim: float) -> np.ndarray:
    """Coordinate-wise trimmed mean: per coordinate, drop the ``floor(trim * n)`` smallest and
    largest of the n values and average the rest (float64, shape [d])."""
    if not 0.0 <= trim < 0.5:
        raise InvalidParameterError(f"trim must be in [0, 0.5), got {trim}")
    rows = np.sort(np.asarray(vectors, dtype=np.float64), axis=0)
    cut = trimmed_count(rows.shape[0], trim)
    return rows[cut : rows.shape[0] - cut].mean(axis=0)


def clip_l2(vector: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """``vector`` scaled to L2 norm at most ``bound``; also whether it had to be scaled."""
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if norm <= bound:
        return vector, False
    return (vector.astype(np.float64) * (bound / norm)).astype(vector.dtype), True


class RobustAggregation(AggregationProtocol):
    """Coordinate-wise median or trimmed mean of the individual updates (plain, no privacy).

    The result's ``weighted_sum`` is the robust centre times the number of accepted clients and
    ``total_weight`` that number, so ``average()`` is the centre. Updates of the wrong shape, with
    NaN/inf, or with a non-positive weight are rejected (``metrics['rejected']``).

    Args:
        rule: ``median`` or ``trimmed_mean``.
        trim: for ``trimmed_mean``, the fraction in [0, 0.5) cut from each end per coordinate
            (it tolerates up to ``floor(trim * n)`` Byzantine clients of n).
        min_clients: fewest valid updates that make an aggregate, >= 1.
    """

    name = "robust"

    def __init__(self, *, rule: str, trim: float = 0.1, min_clients: int = 1) -> None:
        if rule not in RULES:
            raise InvalidParameterError(f"rule must be one of {RULES}, got {rule!r}")
        if not 0.0 <= trim < 0.5:
            raise InvalidParameterError(f"trim must be in [0, 0.5), got {trim}")
        if min_clients < 1:
            raise InvalidParameterError(f"min_clients must be >= 1, got {min_clients}")
        self.rule, self.trim, self.min_clients = rule, trim, min_clients

    def aggregate(
        self, round_index: int, updates: Sequence[ClientUpdate], *, purpose: Purpose = "update"
    ) -> AggregateResult:
        accepted, rejected, _ = screen_updates(updates, self.min_clients)
        rows = np.stack([u.vector for u in accepted]).astype(np.float64)
        if purpose == "statistics":
            # Feature statistics are the honest set-up's weighted moments, not updates to vote on.
            weights = np.array([u.weight for u in accepted], dtype=np.float64)
            total, count = weights @ rows, float(weights.sum())
        else:
            centre = (coordinate_median(rows) if self.rule == "median"
                      else trimmed_mean(rows, self.trim))
            count = float(len(accepted))
            total = centre * count
        return AggregateResult(
            weighted_sum=total,
            total_weight=count,
            participants=tuple(u.client_id for u in accepted),
            dropped=tuple(rejected),
            upload_bytes=sum(u.vector.nbytes + 8 for u in updates),
            metrics={"rejected": float(len(rejected))},
        )


class NormBoundedAggregation(AggregationProtocol):
    """Clips every update's L2 norm to ``bound`` on the client side, then hands the updates to
    ``inner`` (plain, masking, Paillier: anything that sums).

    ``metrics['norm_clipped']`` counts the updates that had to be scaled down. With ``purpose =
    'statistics'`` nothing is clipped (set-up moments are not model updates).

    Args:
        inner: the protocol that sums the clipped updates.
        bound: the L2 bound per update, > 0 (same units as the update vector).
    """

    def __init__(self, *, inner: AggregationProtocol, bound: float) -> None:
        if not (math.isfinite(bound) and bound > 0):
            raise InvalidParameterError(f"bound must be a finite number > 0, got {bound}")
        self.inner, self.bound = inner, float(bound)
        self.name = f"{inner.name}+norm_bound"
        self.client_metrics = inner.client_metrics

    def aggregate(
        self, round_index: int, updates: Sequence[ClientUpdate], *, purpose: Purpose = "update"
    ) -> AggregateResult:
        if purpose != "update":
            return self.inner.aggregate(round_index, updates, purpose=purpose)
        clipped, count = [], 0
        for update in updates:
            vector = update.vector
            if vector.ndim == 1 and np.isfinite(vector).all():
                vector, scaled = clip_l2(vector, self.bound)
                count += scaled
            clipped.append(ClientUpdate(update.client_id, vector, update.weight))
        result = self.inner.aggregate(round_index, clipped, purpose=purpose)
        result.metrics["norm_clipped"] = float(count)
        return result
