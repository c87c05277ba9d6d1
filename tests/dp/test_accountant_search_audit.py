"""Searching adversary against the accountants.

With sampling rate 1, T Gaussian steps of noise multiplier sigma compose EXACTLY to one Gaussian
mechanism of mu = sqrt(T) / sigma, whose (epsilon, delta) curve is known in closed form (Balle &
Wang 2018). A random search over (sigma, T, delta) checks every accountant against it: none may
report an epsilon below the exact one (that would be an unsound budget), and pld/prv must be tight.
It also checks that noise_multiplier_for's sigma keeps the exact epsilon within the target.
"""

import math

import numpy as np
from fedsec.dp.accountants import epsilon
from fedsec.dp.calibration import noise_multiplier_for
from scipy.optimize import brentq
from scipy.stats import norm


def exact_epsilon(mu: float, delta: float) -> float:
    def gap(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta
    if gap(0.0) <= 0:
        return 0.0
    return brentq(gap, 0.0, 500.0, xtol=1e-10)


def test_random_search_no_accountant_undercounts_the_exact_gaussian():
    rng = np.random.default_rng(10)
    worst = {}
    for _ in range(15):
        sigma = float(rng.uniform(0.5, 6.0))
        steps = int(rng.integers(1, 400))
        delta = float(10 ** rng.uniform(-9, -3))
        exact = exact_epsilon(math.sqrt(steps) / sigma, delta)
        for mech in ("pld", "prv", "rdp"):
            got = epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=steps, delta=delta,
                          mechanism=mech)
            assert got >= exact * (1 - 1e-6) - 1e-9, (mech, sigma, steps, delta, got, exact)
            if mech != "rdp":
                worst[mech] = max(worst.get(mech, 0.0), got / max(exact, 1e-12))
    assert worst["pld"] < 1.05 and worst["prv"] < 1.10, worst


def test_calibrated_sigma_stays_within_target_exactly():
    rng = np.random.default_rng(11)
    for _ in range(6):
        target = float(rng.uniform(0.3, 8.0))
        steps = int(rng.integers(1, 200))
        delta = float(10 ** rng.uniform(-8, -4))
        sigma = noise_multiplier_for(target_epsilon=target, delta=delta, sample_rates=[1.0],
                                     steps=[steps], mechanism="pld")
        assert exact_epsilon(math.sqrt(steps) / sigma, delta) <= target * (1 + 1e-9), (
            target, steps, delta, sigma)


def _subsampled_delta(q: float, sigma: float, eps: float) -> float:
    """Exact delta(eps) of one Poisson-subsampled Gaussian step (both neighbouring orders),
    by numerical integration of the hockey-stick divergence."""
    x = np.linspace(-40 * sigma, 40 * sigma + 1, 400001)
    dx = x[1] - x[0]
    p0 = norm.pdf(x, 0, sigma)
    p1 = (1 - q) * p0 + q * norm.pdf(x, 1, sigma)
    a = np.clip(p1 - math.exp(eps) * p0, 0, None).sum() * dx
    b = np.clip(p0 - math.exp(eps) * p1, 0, None).sum() * dx
    return max(a, b)


def test_random_search_single_subsampled_step_not_undercounted():
    rng = np.random.default_rng(12)
    for _ in range(8):
        q = float(rng.uniform(0.01, 0.9))
        sigma = float(rng.uniform(0.5, 3.0))
        delta = float(10 ** rng.uniform(-7, -3))
        for mech in ("pld", "prv", "rdp"):
            got = epsilon(noise_multiplier=sigma, sample_rate=q, steps=1, delta=delta,
                          mechanism=mech)
            true_delta = _subsampled_delta(q, sigma, got)
            assert true_delta <= delta * (1 + 1e-3) + 1e-12, (mech, q, sigma, delta, got, true_delta)
