"""The aggregation seam: the one object the server asks for "the weighted sum of these updates".

Everything between "a client has an update" and "the server has the sum" belongs to the
protocol behind this interface: clipping, encoding, masking, encryption, noise, dropouts. The
server loop knows only :class:`AggregationProtocol`. A privacy layer is added by implementing it
elsewhere (``protocols/``), never by editing ``fl_core``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from fedsec.fl_core.errors import (
    InvalidParameterError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewClientsError,
)
from fedsec.fl_core.parameters import check_vector

Purpose = Literal["update", "statistics"]
"""What a request sums: model updates of a training round, or feature statistics at set-up."""


@dataclass(frozen=True)
class ClientUpdate:
    """One client's contribution to a round: a float32 vector and its weight n_k (> 0)."""

    client_id: int
    vector: np.ndarray
    weight: float


@dataclass(frozen=True)
class AggregateResult:
    """What the server learns from one aggregation.

    Attributes:
        weighted_sum: sum over participants of weight_k * vector_k (float64).
        total_weight: sum over participants of weight_k (> 0).
        participants: ids of the clients whose vectors are in the sum.
        dropped: ids of the requested clients that are not in the sum (dropped out or rejected).
        upload_bytes: bytes the clients sent to the server in this aggregation, all clients.
        metrics: protocol-specific numbers for the round's history (e.g. clipped value counts).
    """

    weighted_sum: np.ndarray
    total_weight: float
    participants: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    upload_bytes: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def average(self) -> np.ndarray:
        """The weighted average, sum / total weight, as float32."""
        return (self.weighted_sum / self.total_weight).astype(np.float32)


class AggregationProtocol(ABC):
    """Computes the weighted sum of client updates; implementations add the privacy.

    Implementations must either return an :class:`AggregateResult` whose ``participants`` are
    exactly the clients in the sum, or raise a subclass of
    :class:`fl_core.errors.AggregationError`; never a partial or wrong sum.
    """

    name: str = "abstract"
    client_metrics: frozenset[str] = frozenset({"train_loss"})
    """What a client may report beside its update, outside the protocol: the names of the
    metrics the server collects (today ``train_loss``, the mean local training loss). A protocol
    that must cover everything a client sends with its own mechanism declares none, and the
    server then neither collects nor records them."""

    @abstractmethod
    def aggregate(
        self, round_index: int, updates: Sequence[ClientUpdate], *, purpose: Purpose = "update"
    ) -> AggregateResult:
        """Sum ``updates`` for round ``round_index`` (0 = set-up, training rounds start at 1)."""


class PlainAggregation(AggregationProtocol):
    """No privacy: the server sees each update and sums them in float64.

    An update of the wrong shape, with NaN/inf, or with a non-positive or non-finite weight is
    rejected (listed in ``dropped`` and counted in ``metrics['rejected']``), never summed.

    Args:
        min_clients: fewest valid contributions that make a sum, >= 1.
    """

    name = "plain"

    def __init__(self, *, min_clients: int = 1) -> None:
        if min_clients < 1:
            raise InvalidParameterError(f"min_clients must be >= 1, got {min_clients}")
        self.min_clients = min_clients

    def aggregate(
        self, round_index: int, updates: Sequence[ClientUpdate], *, purpose: Purpose = "update"
    ) -> AggregateResult:
        accepted, rejected, size = screen_updates(updates, self.min_clients)
        total = np.zeros(size, dtype=np.float64)
        for update in accepted:
            total += float(update.weight) * update.vector.astype(np.float64)
        return AggregateResult(
            weighted_sum=total,
            total_weight=float(sum(u.weight for u in accepted)),
            participants=tuple(u.client_id for u in accepted),
            dropped=tuple(rejected),
            upload_bytes=sum(u.vector.nbytes + 8 for u in updates),
            metrics={"rejected": float(len(rejected))},
        )


def screen_updates(updates: Sequence[ClientUpdate], min_clients: int
                   ) -> tuple[list[ClientUpdate], list[int], int]:
    """Split ``updates`` into the usable ones (finite 1-D vectors of the first update's length,
    finite positive weights) and the ids of the rest; also return that length.

    Raises:
        TooFewClientsError: fewer than ``min_clients`` usable updates.
    """
    if not updates:
        raise TooFewClientsError(0, min_clients)
    size = int(updates[0].vector.shape[0]) if updates[0].vector.ndim == 1 else -1
    accepted: list[ClientUpdate] = []
    rejected: list[int] = []
    for update in updates:
        try:
            check_vector(update.vector, size, what=f"update of client {update.client_id}")
            if not (math.isfinite(update.weight) and update.weight > 0):
                raise NonFiniteError(f"weight of client {update.client_id} must be finite and > 0")
        except (ShapeMismatchError, NonFiniteError):
            rejected.append(update.client_id)
            continue
        accepted.append(update)
    if len(accepted) < min_clients:
        raise TooFewClientsError(len(accepted), min_clients)
    return accepted, rejected, size
