"""Opacus' ``discretize`` of a truncated PRV, evaluating its CDF only where the PMF can be non-zero.

Opacus discretises the one-step PRV on the whole domain [-L, L] of the composition: p_j =
cdf(t_j + dt / 2) - cdf(t_j - dt / 2) at every one of n mesh points, two ``erfc`` and a log each.
One step's privacy loss lives on a small part of it: for q < 1 the CDF is exactly 0 below
log(1 - q) (Opacus' ``np.where``), and above the one-step tail it rounds to exactly 1.0; at
round 1,000 of a run with epsilon 160 the non-zero band is about 4 % of the 11.5 million points,
and for q = 1 below 2 %. There p_j = 0 - 0 or 1 - 1 = 0 exactly.

:func:`discretise` finds the band [lo, hi) by an interval search on the (non-decreasing) CDF,
widens it by ``GUARD`` points on each side, evaluates Opacus' expressions on it (the same
elementwise float operations on the same grid values), and leaves exact zeros elsewhere; the mean
correction (``np.dot`` over the whole grid, Opacus' quadrature of the mean) and its check are
Opacus' own. The result is Opacus' PMF bit for bit wherever the CDF's floating-point values are
non-decreasing (tests/dp/test_prv_spectral.py compares whole PMFs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from opacus.accountants.analysis.prv import Domain, TruncatedPrivacyRandomVariable
from opacus.accountants.analysis.prv.prvs import DiscretePRV

GUARD = 64
"""Mesh points evaluated beyond each end of the band found."""


def first_index(predicate: Callable[[np.ndarray], np.ndarray], size: int, probes: int = 32) -> int:
    """The smallest j in [0, size) with ``predicate`` true (``size`` if none), for a predicate
    false then true along the indices; ``predicate`` maps an index array to a bool array."""
    lo, hi = -1, size  # predicate(lo) false, predicate(hi) true, by convention at the ends
    while hi - lo > 1:
        index = np.unique(np.linspace(lo, hi, probes + 2).round().astype(np.int64)[1:-1])
        index = index[(index > lo) & (index < hi)]
        true = np.flatnonzero(predicate(index))
        if true.size:
            hi = int(index[true[0]])
            if true[0] > 0:
                lo = int(index[true[0] - 1])
        else:
            lo = int(index[-1])
    return hi


def discretise(prv: TruncatedPrivacyRandomVariable, domain: Domain) -> DiscretePRV:
    """Opacus' ``discretize(prv, domain)`` (module docstring)."""
    t = domain.ts
    half = domain.dt / 2
    lo = first_index(lambda j: prv.cdf(t[j] + half) != 0.0, domain.size)
    hi = first_index(lambda j: prv.cdf(t[j] - half) == 1.0, domain.size)
    lo, hi = max(lo - GUARD, 0), min(hi + GUARD, domain.size)
    pmf = np.zeros(domain.size)
    if lo < hi:
        band = t[lo:hi]
        pmf[lo:hi] = prv.cdf(band + half) - prv.cdf(band - half)
    mean_shift = prv.mean() - np.dot(t, pmf)
    if np.abs(mean_shift) >= domain.dt / 2:
        raise RuntimeError("Discrete mean differs significantly from continuous mean.")
    return DiscretePRV(pmf=pmf, domain=domain.shift_right(mean_shift))
