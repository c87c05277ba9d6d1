"""Feature standardisation with federation-wide statistics computed through the seam.

No client reveals its own statistics: each sends its per-feature mean, then its mean squared
deviation from the global mean, weighted by n_k, to the aggregation protocol
(``purpose="statistics"``), and only the global moments come back. The global mean and standard
deviation then scale every client and the test split alike, exactly as a centralised scaler on
the pooled training data would.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.aggregation import AggregationProtocol, ClientUpdate
from fedsec.fl_core.data import ArrayDataset, FederatedDataset
from fedsec.fl_core.errors import AggregationError

MIN_STD = 1e-8
ATTEMPTS = 3
"""An aborted statistics aggregation (e.g. too many dropouts) is retried up to this many times."""


def federated_moments(
    data: FederatedDataset, protocol: AggregationProtocol
) -> tuple[np.ndarray, np.ndarray, int]:
    """Return the global per-feature ``(mean, std, upload_bytes)`` of the clients' training data.

    Two aggregations: first the n_k-weighted means, then the weighted second moments about the
    global mean (better conditioned than E[x^2] - mean^2 in fixed point), each tried up to
    ``ATTEMPTS`` times. Raises AggregationError if the protocol had to clip any statistic or
    aborted every attempt.
    """
    d = int(np.prod(data.input_shape))
    flats = [c.x.reshape(len(c), d).astype(np.float64) for c in data.clients]

    def aggregate(vectors: list[np.ndarray]) -> tuple[np.ndarray, int]:
        updates = [ClientUpdate(k, v.astype(np.float32), float(len(data.clients[k])))
                   for k, v in enumerate(vectors)]
        for attempt in range(ATTEMPTS):
            try:
                result = protocol.aggregate(0, updates, purpose="statistics")
                break
            except AggregationError:
                if attempt == ATTEMPTS - 1:
                    raise
        if result.metrics.get("clipped", 0) > 0:
            raise AggregationError("feature statistics exceed the aggregation protocol's range")
        return result.weighted_sum / result.total_weight, result.upload_bytes

    mean, upload_mean = aggregate([f.mean(axis=0) for f in flats])
    variance, upload_var = aggregate([((f - mean) ** 2).mean(axis=0) for f in flats])
    std = np.sqrt(np.maximum(variance, 0.0))
    std[std < MIN_STD] = 1.0
    return mean, std, upload_mean + upload_var


def apply_standardization(
    data: FederatedDataset, mean: np.ndarray, std: np.ndarray
) -> FederatedDataset:
    """Return a copy of ``data`` with every client's and the test split's features standardised."""

    def scale(part: ArrayDataset) -> ArrayDataset:
        flat = part.x.reshape(len(part), -1)
        scaled = ((flat - mean) / std).astype(np.float32).reshape(part.x.shape)
        return ArrayDataset(scaled, part.y)

    return FederatedDataset(
        name=data.name,
        clients=tuple(scale(c) for c in data.clients),
        test=scale(data.test),
        n_classes=data.n_classes,
        input_shape=data.input_shape,
        standardize=False,
        info={**data.info, "feature_mean": mean, "feature_std": std},
    )


def linear_in_raw_units(
    weights: np.ndarray, bias: float, mean: np.ndarray, std: np.ndarray
) -> tuple[float, np.ndarray]:
    """Map a linear model trained on z = (x - mean) / std back to raw units.

    Returns ``(intercept, theta)`` with ``intercept + x @ theta == bias + z @ weights`` for all x.
    """
    theta = np.asarray(weights, dtype=np.float64) / std
    return float(bias) - float(np.sum(theta * mean)), theta
