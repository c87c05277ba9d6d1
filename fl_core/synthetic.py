"""Synthetic logistic-regression federations: the simulation set-ups of the FL literature.

Features follow x ~ N_p(mu, R) with a random correlation matrix R whose off-diagonal entries are
drawn r_ij ~ Beta(1, 2) (made well conditioned by flooring its eigenvalues at 0.1 and rescaled to a unit
diagonal), labels follow y ~ Bernoulli(sigmoid(b + x' theta)). Four set-ups:

1. balanced IID: every client draws n / K samples from the same distribution;
2. damaged sensor: as 1, but client 3 (index 2) reads feature 0 through a faulty sensor
   (gain 2, offset +1) while its labels still follow the true feature;
3. unbalanced IID: the same distribution, client sizes log-normal (sigma 1);
4. unbalanced non-IID: sizes as 3, and each client has its own mean (mu + N(0, 0.5^2)) and its
   own parameters (theta + N(0, 0.5^2)).

``info`` of the result holds the true ``theta``, ``intercept``, ``mu`` and ``R``.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.data import ArrayDataset, FederatedDataset
from fedsec.fl_core.errors import InvalidParameterError

SETUPS = (1, 2, 3, 4)
SENSOR_CLIENT = 2
SENSOR_FEATURE = 0
SENSOR_GAIN = 2.0
SENSOR_OFFSET = 1.0
CLIENT_SHIFT_STD = 0.5
MIN_CLIENT_SAMPLES = 10


def random_correlation(p: int, rng: np.random.Generator, floor: float = 0.1) -> np.ndarray:
    """A p x p correlation matrix from Beta(1, 2) off-diagonal draws.

    Such a matrix is rarely positive semi-definite (never, at p = 10), so its eigenvalues are
    floored at ``floor`` and the diagonal rescaled to 1: with the default 0.1 the condition number
    stays near 40 at p = 10, so theta is identifiable from a few thousand samples.
    """
    upper = np.triu(rng.beta(1.0, 2.0, size=(p, p)), k=1)
    r = upper + upper.T + np.eye(p)
    values, vectors = np.linalg.eigh(r)
    r = (vectors * np.maximum(values, floor)) @ vectors.T
    d = np.sqrt(np.diag(r))
    return r / np.outer(d, d)


def _client_sizes(setup: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if setup in (1, 2):
        return np.diff(np.linspace(0, n, k + 1).round().astype(np.int64))
    shares = rng.lognormal(0.0, 1.0, size=k)
    return MIN_CLIENT_SAMPLES + rng.multinomial(n - MIN_CLIENT_SAMPLES * k, shares / shares.sum())


def make_synthetic(
    *,
    setup: int,
    n_clients: int,
    n_samples: int,
    n_features: int,
    test_fraction: float,
    rng: np.random.Generator,
) -> FederatedDataset:
    """Draw a synthetic federation.

    Args:
        setup: 1-4 (see the module docstring); set-up 2 needs at least 3 clients.
        n_clients: K >= 1.
        n_samples: samples over all clients, train and test together; at least
            ``MIN_CLIENT_SAMPLES`` (10) per client, so each client can hold out test samples.
        n_features: p >= 1.
        test_fraction: share of each client's draws pooled into the global test split, in (0, 1).
    """
    if setup not in SETUPS:
        raise InvalidParameterError(f"synthetic setup must be one of {SETUPS}, got {setup}")
    if n_clients < 1:
        raise InvalidParameterError(f"clients must be >= 1, got {n_clients}")
    if setup == 2 and n_clients <= SENSOR_CLIENT:
        raise InvalidParameterError("synthetic setup 2 (damaged sensor of client 3) needs >= 3 clients")
    if n_samples < MIN_CLIENT_SAMPLES * n_clients:
        raise InvalidParameterError(
            f"samples must be >= {MIN_CLIENT_SAMPLES} x clients = {MIN_CLIENT_SAMPLES * n_clients}, "
            f"got {n_samples}"
        )
    if n_features < 1:
        raise InvalidParameterError(f"features must be >= 1, got {n_features}")
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError(f"test_fraction must be in (0, 1), got {test_fraction}")

    corr = random_correlation(n_features, rng)
    chol = np.linalg.cholesky(corr)
    mu = rng.uniform(-1.0, 1.0, size=n_features)
    theta = rng.standard_normal(n_features)
    intercept = float(rng.normal(0.0, 0.5))
    sizes = _client_sizes(setup, n_samples, n_clients, rng)

    clients, tests = [], []
    for k, size in enumerate(sizes):
        mu_k, theta_k = mu, theta
        if setup == 4:
            mu_k = mu + rng.normal(0.0, CLIENT_SHIFT_STD, size=n_features)
            theta_k = theta + rng.normal(0.0, CLIENT_SHIFT_STD, size=n_features)
        x = mu_k + rng.standard_normal((int(size), n_features)) @ chol.T
        p = 1.0 / (1.0 + np.exp(-(intercept + x @ theta_k)))
        y = (rng.random(int(size)) < p).astype(np.int64)
        if setup == 2 and k == SENSOR_CLIENT:
            x[:, SENSOR_FEATURE] = SENSOR_GAIN * x[:, SENSOR_FEATURE] + SENSOR_OFFSET
        n_test = min(max(int(round(test_fraction * size)), 1), int(size) - 1)
        clients.append(ArrayDataset(x[n_test:], y[n_test:]))
        tests.append(ArrayDataset(x[:n_test], y[:n_test]))

    test = ArrayDataset(np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests]))
    return FederatedDataset(
        name="synthetic",
        clients=tuple(clients),
        test=test,
        n_classes=2,
        input_shape=(n_features,),
        standardize=True,
        info={"setup": setup, "theta": theta, "intercept": intercept, "mu": mu, "R": corr},
    )
