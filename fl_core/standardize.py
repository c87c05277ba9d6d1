"""Feature standardisation with federation-wide statistics computed through the seam.

No client reveals its own statistics: each sends its per-feature mean and mean of squares,
weighted by n_k, to the aggregation protocol (``purpose="statistics"``), and only the global
moments come back. The global mean and standard deviation then scale every client and the
test split alike, exactly as a centralised scaler on the pooled training data would.
"""

from __future__ import annotations

import numpy as np

from fl_core.aggregation import AggregationProtocol, ClientUpdate
from fl_core.data import ArrayDataset, FederatedDataset

MIN_STD = 1e-8


def federated_moments(
    data: FederatedDataset, protocol: AggregationProtocol
) -> tuple[np.ndarray, np.ndarray, int]:
    """Return the global per-feature ``(mean, std, upload_bytes)`` of the clients' training data."""
    d = int(np.prod(data.input_shape))
    updates = []
    for k, client in enumerate(data.clients):
        flat = client.x.reshape(len(client), d).astype(np.float64)
        moments = np.concatenate([flat.mean(axis=0), (flat**2).mean(axis=0)])
        updates.append(ClientUpdate(k, moments.astype(np.float32), float(len(client))))
    result = protocol.aggregate(0, updates, purpose="statistics")
    average = result.weighted_sum / result.total_weight
    mean, second = average[:d], average[d:]
    std = np.sqrt(np.maximum(second - mean**2, 0.0))
    std[std < MIN_STD] = 1.0
    return mean, std, result.upload_bytes


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
