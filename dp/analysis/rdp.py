"""Rényi DP (Mironov 2017): the subsampled Gaussian via dp-accounting, the Skellam mechanism via
the bound of Agarwal, Kairouz and Liu (NeurIPS 2021, Theorem 3.5):

    eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu))

for integer alpha > 1, noise variance mu per coordinate and sensitivities D1, D2 in integer units.
RDP composes by addition; the conversion to (epsilon, delta) is dp-accounting's (Balle et al.
2020, Proposition 12; Canonne et al. 2020).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp import RdpAccountant, compute_epsilon
from dp_accounting.rdp.rdp_privacy_accountant import (
    DEFAULT_RDP_ORDERS,
    _compute_rdp_poisson_subsampled_gaussian,
)
from fedsec.dp.analysis.pld import to_dp_event
from fedsec.dp.errors import UnsupportedEventError
from fedsec.dp.ledger import Event, GaussianEvent, SkellamEvent

ORDERS = tuple(range(2, 64)) + tuple(range(64, 257, 8)) + (320, 384, 512, 768, 1024)
"""Integer orders for the Skellam bound (it holds for integer orders only)."""


def skellam_rdp(event: SkellamEvent, orders: Sequence[int] = ORDERS) -> np.ndarray:
    """RDP of ``event`` (all its steps) at each integer order."""
    a = np.asarray(orders, dtype=np.float64)
    mu, d1, d2sq = event.variance, event.l1, event.l2 ** 2
    surcharge = np.minimum(((2 * a - 1) * d2sq + 6 * d1) / (4 * mu ** 2), 3 * d1 / (2 * mu))
    return event.steps * (a * d2sq / (2 * mu) + surcharge)


@functools.lru_cache(maxsize=256)
def gaussian_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step at dp-accounting's default orders (what its
    ``RdpAccountant`` adds, times the count, for each step; q >= 1 is the plain Gaussian). Cached:
    a run adds the same step every round, and this series is the whole cost of the analysis."""
    logging.disable(logging.WARNING)  # an order whose series does not converge is dropped
    try:                              # (the bound still holds); dp-accounting logs each one
        value = _compute_rdp_poisson_subsampled_gaussian(
            q=min(float(sample_rate), 1.0), noise_multiplier=noise_multiplier,
            orders=np.array(DEFAULT_RDP_ORDERS))
    finally:
        logging.disable(logging.NOTSET)
    value = np.asarray(value, dtype=np.float64)
    value.setflags(write=False)
    return value


@functools.lru_cache(maxsize=64)
def _conversion_terms(delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order > 1.01, log1p(-1 / a), log(delta a) / (a - 1)) at dp-accounting's default orders a,
    each term computed by ``math`` as ``compute_epsilon`` computes it."""
    orders = [float(a) for a in DEFAULT_RDP_ORDERS]
    usable = np.array([a > 1.01 for a in orders])
    first = np.array([math.log1p(-1 / a) if a > 1.01 else 0.0 for a in orders])
    second = np.array([math.log(delta * a) / (a - 1) if a > 1.01 else 0.0 for a in orders])
    return usable, first, second


def default_orders_epsilon(rdp: np.ndarray, delta: float) -> float:
    """dp-accounting's ``compute_epsilon(DEFAULT_RDP_ORDERS, rdp, delta)[0]``, bit for bit, as
    array operations (its Python loop over the 156 orders was a tenth of a PLD budget's round):
    epsilon_a = (r_a + log1p(-1 / a)) - log(delta a) / (a - 1), the same two IEEE operations per
    order on the same terms; 0 where delta^2 + expm1(-r_a) > 0 (decided by ``math`` for the
    orders where it can hold, r_a <= 4 delta^2); inf at orders <= 1.01; the first smallest wins.
    A negative r_a (dp-accounting logs it), delta outside (0, 0.5) (where r_a <= 4 delta^2 would
    not cover the zero branch) or another shape goes to dp-accounting's own loop."""
    rdp = np.asarray(rdp, dtype=np.float64)
    if not 0 < delta < 0.5 or rdp.shape != (len(DEFAULT_RDP_ORDERS),) or bool((rdp < 0).any()):
        return float(compute_epsilon(np.array(DEFAULT_RDP_ORDERS), rdp, delta)[0])
    usable, first, second = _conversion_terms(float(delta))
    eps = np.where(usable, (rdp + first) - second, np.inf)
    for i in np.flatnonzero(rdp <= 4 * delta * delta):
        if delta ** 2 + math.expm1(-float(rdp[i])) > 0:
            eps[i] = 0.0
    return float(max(0, eps[int(np.argmin(eps))]))


def epsilon(events: Sequence[Event], delta: float, *, from_scratch: bool = False) -> float:
    """Epsilon at ``delta``; the Gaussian steps compose as dp-accounting's ``RdpAccountant``
    composes them (the same sums in the same order, from the cached per-step RDP unless
    ``from_scratch``)."""
    kinds = {type(e) for e in events}
    if kinds <= {GaussianEvent} and from_scratch:
        accountant = RdpAccountant()  # dp-accounting's default orders, fractional ones included
        logging.disable(logging.WARNING)
        try:
            for event in events:
                accountant.compose(to_dp_event(event))
            return float(accountant.get_epsilon(delta))
        finally:
            logging.disable(logging.NOTSET)
    if kinds <= {GaussianEvent}:
        total = np.zeros(len(DEFAULT_RDP_ORDERS), dtype=np.float64)
        for event in events:
            total += event.steps * gaussian_rdp(event.noise_multiplier, event.sample_rate)
        return default_orders_epsilon(total, delta)
    if kinds <= {SkellamEvent}:
        total = sum(skellam_rdp(e) for e in events)
        eps, _ = compute_epsilon(list(ORDERS), total, delta)
        return float(eps)
    raise UnsupportedEventError("an RDP ledger mixes Gaussian and Skellam events")
