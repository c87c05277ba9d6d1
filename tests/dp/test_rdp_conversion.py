"""The RDP cross-check's conversion to (epsilon, delta) as array operations equals dp-accounting's
``compute_epsilon`` bit for bit (``rdp.default_orders_epsilon``): random RDP curves, zeros, tiny
values at the zero branch's edge, infinities, negative values and every delta regime."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from dp_accounting.rdp import compute_epsilon
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from fedsec.dp.analysis import rdp
from fedsec.dp.ledger import GaussianEvent
from hypothesis import given, settings
from hypothesis import strategies as st

ORDERS = np.array(DEFAULT_RDP_ORDERS)
SIZE = len(DEFAULT_RDP_ORDERS)


def _theirs(curve: np.ndarray, delta: float) -> float:
    logging.disable(logging.WARNING)
    try:
        return float(compute_epsilon(ORDERS, curve, delta)[0])
    finally:
        logging.disable(logging.NOTSET)


def _same(curve: np.ndarray, delta: float) -> None:
    mine, theirs = rdp.default_orders_epsilon(curve, delta), _theirs(curve, delta)
    assert np.float64(mine).tobytes() == np.float64(theirs).tobytes(), (mine, theirs)


values = st.one_of(st.floats(0, 1e4), st.floats(0, 1e-8), st.sampled_from([0.0, np.inf, 5e-11, 1e-10]),
                   st.floats(-1e-3, 0))
deltas = st.one_of(st.floats(1e-15, 0.49), st.sampled_from([1e-5, 1e-7, 1e-10, 0.3, 0.49, 0.5, 0.9, 0.0]))


@settings(max_examples=300, deadline=None)
@given(curve=st.lists(values, min_size=SIZE, max_size=SIZE), delta=deltas)
def test_any_curve_converts_as_dp_accounting_does(curve, delta):
    _same(np.array(curve, dtype=np.float64), delta)


@settings(max_examples=100, deadline=None)
@given(sigma=st.floats(0.3, 50), q=st.floats(1e-4, 1.0), steps=st.integers(1, 10**6),
       delta=st.floats(1e-12, 0.1))
def test_a_subsampled_gaussian_ledger_converts_as_dp_accounting_does(sigma, q, steps, delta):
    _same(steps * rdp.gaussian_rdp(sigma, q), delta)


@pytest.mark.parametrize("delta", [1e-5, 0.2])
def test_the_zero_branch_edge(delta):
    edge = -np.log1p(-delta ** 2)  # delta^2 + expm1(-r) crosses 0 here
    for r in np.nextafter(edge, [0, np.inf, 2 * edge]).tolist() + [edge]:
        _same(np.full(SIZE, r), delta)


def test_the_budget_route_is_the_fast_one():
    ledger = [GaussianEvent(1.1, 0.01, 1000)]
    assert rdp.epsilon(ledger, 1e-5) == _theirs(1000 * rdp.gaussian_rdp(1.1, 0.01), 1e-5)
