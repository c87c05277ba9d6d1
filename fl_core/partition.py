"""Ways to split one pool of samples among clients.

Every scheme returns one sorted index array per client; together they cover every sample exactly
once and every client receives at least one sample. All randomness comes from the caller's
``numpy.random.Generator``, so a partition is reproducible from the run's seed.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError

PARTITION_SCHEMES = ("iid", "unbalanced", "shards", "dirichlet", "feature_bias")


def partition_indices(
    *,
    scheme: str,
    labels: np.ndarray,
    features: np.ndarray,
    n_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    unbalance_sigma: float = 1.0,
) -> list[np.ndarray]:
    """Split ``len(labels)`` samples among ``n_clients`` clients.

    Args:
        scheme: ``iid`` (uniform, equal sizes); ``unbalanced`` (uniform, log-normal sizes with
            ``unbalance_sigma``); ``shards`` (sorted by label, cut into
            ``n_clients * shards_per_client`` shards, each client gets ``shards_per_client``:
            McMahan et al.'s pathological non-IID); ``dirichlet`` (each class spread over clients
            by proportions drawn from Dirichlet(``alpha``); smaller alpha = more label skew);
            ``feature_bias`` (samples ordered by a random projection of their features and cut into
            contiguous blocks: each client sees its own region of feature space).
        labels: integer class labels, shape (n,).
        features: samples, first axis n (only ``feature_bias`` reads them).
        n_clients: 1 <= n_clients <= n.
        alpha: Dirichlet concentration, > 0.
        shards_per_client: >= 1, with n_clients * shards_per_client <= n.
    """
    n = int(labels.shape[0])
    if scheme not in PARTITION_SCHEMES:
        raise InvalidParameterError(f"partition must be one of {PARTITION_SCHEMES}, got {scheme!r}")
    if not 1 <= n_clients <= n:
        raise InvalidParameterError(
            f"clients must be between 1 and the number of training samples ({n}), got {n_clients}"
        )
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), n_clients)
    elif scheme == "unbalanced":
        parts = _unbalanced(n, n_clients, rng, unbalance_sigma)
    elif scheme == "shards":
        parts = _shards(labels, n_clients, shards_per_client, rng)
    elif scheme == "dirichlet":
        parts = _dirichlet(labels, n_clients, alpha, rng)
    else:
        parts = _feature_bias(features, n_clients, rng)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _unbalanced(n: int, k: int, rng: np.random.Generator, sigma: float) -> list[np.ndarray]:
    if sigma <= 0:
        raise InvalidParameterError(f"unbalance_sigma must be > 0, got {sigma}")
    shares = rng.lognormal(mean=0.0, sigma=sigma, size=k)
    sizes = 1 + rng.multinomial(n - k, shares / shares.sum())
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


def _shards(labels: np.ndarray, k: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    if per_client < 1:
        raise InvalidParameterError(f"shards_per_client must be >= 1, got {per_client}")
    n_shards = k * per_client
    if n_shards > labels.shape[0]:
        raise InvalidParameterError(
            f"clients x shards_per_client = {n_shards} exceeds the {labels.shape[0]} training samples"
        )
    # Sort by label, ties broken at random, then cut into equal shards.
    order = np.lexsort((rng.random(labels.shape[0]), labels))
    shards = np.array_split(order, n_shards)
    assignment = rng.permutation(n_shards).reshape(k, per_client)
    return [np.concatenate([shards[s] for s in row]) for row in assignment]


def _dirichlet(labels: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    if not alpha > 0:
        raise InvalidParameterError(f"alpha must be > 0, got {alpha}")
    owner = np.empty(labels.shape[0], dtype=np.int64)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(k, alpha))
        counts = rng.multinomial(members.size, proportions)
        owner[members] = np.repeat(np.arange(k), counts)
    sizes = np.bincount(owner, minlength=k)
    # A client left empty takes one sample from the currently largest client.
    for client in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        moved = rng.choice(np.flatnonzero(owner == donor))
        owner[moved] = client
        sizes[donor] -= 1
        sizes[client] += 1
    return [np.flatnonzero(owner == c) for c in range(k)]


def _feature_bias(features: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    flat = features.reshape(features.shape[0], -1).astype(np.float64)
    spread = flat.std(axis=0)
    spread[spread == 0] = 1.0
    direction = rng.standard_normal(flat.shape[1])
    score = ((flat - flat.mean(axis=0)) / spread) @ direction
    order = np.lexsort((rng.random(score.size), score))
    return np.array_split(order, k)
