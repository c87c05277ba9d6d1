"""The bundled data sets, all offline: breast cancer, digits, and synthetic logistic regression.

``load_federated`` is the one entry point: it holds out a global test split first, then gives each
client its training data, so no test sample ever reaches a client.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.data import ArrayDataset, FederatedDataset, stratified_split
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.partition import partition_indices
from fedsec.fl_core.synthetic import make_synthetic

DATASET_NAMES = ("breast_cancer", "digits", "synthetic")


def load_pool(name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(x, y, n_classes)`` of a bundled pooled data set.

    ``breast_cancer``: scikit-learn's Wisconsin diagnostic set, 569 x 30 raw features, 2 classes.
    ``digits``: scikit-learn's 1,797 8x8 images, intensities divided by their fixed maximum 16
    into [0, 1], shaped (n, 1, 8, 8), 10 classes.
    """
    from sklearn import datasets as skdatasets

    if name == "breast_cancer":
        bunch = skdatasets.load_breast_cancer()
        return bunch.data.astype(np.float32), bunch.target.astype(np.int64), 2
    if name == "digits":
        bunch = skdatasets.load_digits()
        x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
        return x, bunch.target.astype(np.int64), 10
    raise InvalidParameterError(f"no pooled data set named {name!r}")


def load_federated(
    name: str,
    *,
    n_clients: int,
    partition: str = "iid",
    test_fraction: float = 0.2,
    rng: np.random.Generator,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    synthetic_setup: int = 1,
    synthetic_samples: int = 2000,
    synthetic_features: int = 10,
) -> FederatedDataset:
    """Load data set ``name`` split among ``n_clients`` clients plus a global test split.

    For ``breast_cancer`` and ``digits`` a stratified ``test_fraction`` is held out and the rest is
    partitioned with ``partition`` (see :func:`fl_core.partition.partition_indices`). For
    ``synthetic`` each client draws its own samples according to ``synthetic_setup`` (1-4, see
    :mod:`fl_core.synthetic`), which fixes both client sizes and distributions, so only
    ``partition="iid"`` (the default, meaning "as the set-up says") is accepted.
    """
    if name not in DATASET_NAMES:
        raise InvalidParameterError(f"dataset must be one of {DATASET_NAMES}, got {name!r}")
    if name == "synthetic":
        if partition != "iid":
            raise InvalidParameterError(
                "partition does not apply to the synthetic data set: its set-up (1-4) fixes how "
                f"clients differ; got partition={partition!r}"
            )
        return make_synthetic(
            setup=synthetic_setup,
            n_clients=n_clients,
            n_samples=synthetic_samples,
            n_features=synthetic_features,
            test_fraction=test_fraction,
            rng=rng,
        )
    x, y, n_classes = load_pool(name)
    train_idx, test_idx = stratified_split(y, test_fraction=test_fraction, rng=rng)
    if n_clients > train_idx.size:
        raise InvalidParameterError(
            f"clients ({n_clients}) exceeds the {train_idx.size} training samples of {name}"
        )
    parts = partition_indices(
        scheme=partition,
        labels=y[train_idx],
        features=x[train_idx],
        n_clients=n_clients,
        rng=rng,
        alpha=alpha,
        shards_per_client=shards_per_client,
    )
    clients = tuple(ArrayDataset(x[train_idx[p]], y[train_idx[p]]) for p in parts)
    return FederatedDataset(
        name=name,
        clients=clients,
        test=ArrayDataset(x[test_idx], y[test_idx]),
        n_classes=n_classes,
        input_shape=tuple(x.shape[1:]),
        standardize=(name == "breast_cancer"),
        info={"partition": partition},
    )
