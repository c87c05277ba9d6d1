"""Simulated Byzantine clients: a fixed set of clients replaces its honest update with a lie.

The lie is made on the client, before its update enters the aggregation protocol: it models a
client whose data or training is poisoned but whose client software (clipping, encoding, masking)
is the project's own. A client that also rewrote its encoder could send any value of the ring
under masking; nothing here claims robustness against that (it needs range proofs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fedsec.fl_core.errors import InvalidParameterError

ATTACKS = ("sign_flip", "scale", "noise")


def corrupt(vector: np.ndarray, attack: str, *, factor: float, rng: np.random.Generator) -> np.ndarray:
    """One Byzantine update from the honest ``vector``.

    ``sign_flip``: -u. ``scale``: factor * u. ``noise``: Gaussian N(0, s^2 I) with s = factor times
    the honest update's root-mean-square coordinate (a random direction, ``factor`` times as large).
    """
    u = vector.astype(np.float64)
    if attack == "sign_flip":
        lie = -u
    elif attack == "scale":
        lie = factor * u
    elif attack == "noise":
        rms = float(np.sqrt(np.mean(u**2))) if u.size else 0.0
        lie = rng.normal(0.0, factor * max(rms, 1e-3), size=u.shape)
    else:
        raise InvalidParameterError(f"attack must be one of {ATTACKS}, got {attack!r}")
    return lie.astype(vector.dtype)


class ByzantineClients(AggregationProtocol):
    """Wraps a protocol; the clients in ``malicious`` send ``corrupt(update)`` instead of theirs.

    Args:
        inner: the protocol the (partly corrupted) updates go to.
        malicious: ids of the Byzantine clients.
        attack: one of ``sign_flip``, ``scale``, ``noise``.
        factor: the attack's size (> 0): the multiplier of ``scale``, the relative noise scale
            of ``noise``; ignored by ``sign_flip``.
        rng: the experiment generator the noise attack draws from.
    """

    def __init__(self, *, inner: AggregationProtocol, malicious: Iterable[int], attack: str,
                 factor: float = 10.0, rng: np.random.Generator) -> None:
        if attack not in ATTACKS:
            raise InvalidParameterError(f"attack must be one of {ATTACKS}, got {attack!r}")
        if not (np.isfinite(factor) and factor > 0):
            raise InvalidParameterError(f"factor must be a finite number > 0, got {factor}")
        self.inner, self.malicious = inner, frozenset(int(k) for k in malicious)
        self.attack, self.factor, self.rng = attack, float(factor), rng
        self.name = inner.name
        self.client_metrics = inner.client_metrics

    def aggregate(
        self, round_index: int, updates: Sequence[ClientUpdate], *, purpose: Purpose = "update"
    ) -> AggregateResult:
        if purpose == "update":
            updates = [
                ClientUpdate(u.client_id, corrupt(u.vector, self.attack, factor=self.factor,
                                                  rng=self.rng), u.weight)
                if u.client_id in self.malicious else u
                for u in updates
            ]
        return self.inner.aggregate(round_index, updates, purpose=purpose)
