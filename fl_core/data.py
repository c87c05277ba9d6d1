"""Array containers for client data and the federated data set of an experiment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fedsec.fl_core.errors import InvalidParameterError, ShapeMismatchError


def _canonical(array: np.ndarray, dtype: type) -> np.ndarray:
    """``array`` as ``dtype``, C-ordered with the canonical strides of its shape (itself if so)."""
    canonical = np.dtype(dtype).itemsize * np.cumprod((1, *array.shape[:0:-1]))[::-1]
    if array.dtype == dtype and array.strides == tuple(int(s) for s in canonical):
        return array
    return np.array(array, dtype=dtype, order="C", copy=True)


@dataclass(frozen=True)
class ArrayDataset:
    """Samples ``x`` (float32, first axis = sample) and integer labels ``y`` (int64).

    Both are stored C-ordered with the canonical strides of their shape, also along axes of
    length 1: torch picks a convolution's memory format from the strides (``(n, 1, 8, 8)`` images
    strided like channels-last train through another kernel, with other rounding), and a copy
    (pickle, Ray's object store) always has canonical strides, so a client trains to the same
    bits wherever its data went."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ShapeMismatchError(
                f"x has {self.x.shape[0]} samples but y has {self.y.shape[0]} labels"
            )
        object.__setattr__(self, "x", _canonical(self.x, np.float32))
        object.__setattr__(self, "y", _canonical(self.y, np.int64))

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, index: np.ndarray) -> ArrayDataset:
        return ArrayDataset(self.x[index], self.y[index])


@dataclass(frozen=True)
class FederatedDataset:
    """Each client's training data plus one held-out global test split.

    Attributes:
        clients: training data of client k at position k; each holds at least one sample.
        test: the global test split the server evaluates on.
        n_classes: number of classes (>= 2).
        input_shape: shape of one sample.
        standardize: whether features must be standardised (with federation-wide statistics)
            before training; False where the scale is known a priori (pixel intensities).
        info: facts about how the data was made (for example the true parameters of a
            synthetic set-up); never read by training.
    """

    name: str
    clients: tuple[ArrayDataset, ...]
    test: ArrayDataset
    n_classes: int
    input_shape: tuple[int, ...]
    standardize: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.clients:
            raise InvalidParameterError("a federated data set needs at least one client")
        empty = [k for k, c in enumerate(self.clients) if len(c) == 0]
        if empty:
            raise InvalidParameterError(f"clients {empty} hold no samples")

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    def pooled(self) -> ArrayDataset:
        """The union of all clients' training data (for centralised baselines only)."""
        return ArrayDataset(
            np.concatenate([c.x for c in self.clients]), np.concatenate([c.y for c in self.clients])
        )


def stratified_split(
    y: np.ndarray, *, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into (train, test) keeping each class's share in both.

    ``test_fraction`` must lie in (0, 1); every class with two or more samples keeps at least one
    sample on each side.
    """
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError(f"test_fraction must be in (0, 1), got {test_fraction}")
    train, test = [], []
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        n_test = int(round(test_fraction * members.size))
        if members.size >= 2:
            n_test = min(max(n_test, 1), members.size - 1)
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
