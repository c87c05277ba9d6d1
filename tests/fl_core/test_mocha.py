"""MOCHA: the dual map W = V Sigma / lambda, exactness against an independent primal solver at fixed
Omega, the task-covariance update, and stragglers.

Adversary played here: the clients' own slowness (any pattern of stragglers and skipped rounds,
searched at random): the claim is that with sigma' = lambda_max(D^{-1/2} Sigma D^{-1/2}) no pattern
lowers the dual at fixed Sigma, and the primal-dual map stays exact. MOCHA's server sees every
client's model (plain only); there is no secrecy claim to attack.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.duality import signed_labels, with_intercept
from fedsec.fl_core.mocha import Mocha, MochaClient, safe_sigma_prime, task_covariance
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import sqrtm
from scipy.optimize import minimize


def tasks(m: int = 3, n: int = 40, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(d)
    out = []
    for _ in range(m):
        x = rng.standard_normal((n, d)) + rng.normal(0, 0.5, d)
        theta = base + rng.normal(0, 0.7, d)
        out.append((x, (x @ theta + 0.3 * rng.standard_normal(n) > 0).astype(np.int64)))
    return out


def clients_of(parts) -> list[MochaClient]:
    return [MochaClient(client_id=t, x=x, y=y) for t, (x, y) in enumerate(parts)]


def dual_map(clients, sigma, lam):
    n = sum(c.n for c in clients)
    v = np.stack([(c.alpha * c.y) @ c.x / n for c in clients], axis=1)
    return v @ sigma / lam


def reference(parts, sigma, lam):
    """Minimise (1/n) sum logistic + (lambda/2) tr(W Sigma^{-1} W^T) over W with L-BFGS."""
    xs = [with_intercept(x) for x, _ in parts]
    ys = [signed_labels(y) for _, y in parts]
    n, d, m = sum(len(y) for y in ys), xs[0].shape[1], len(parts)
    omega = np.linalg.inv(sigma)

    def objective(flat):
        w = flat.reshape(d, m)
        value, grad = 0.5 * lam * np.trace(w @ omega @ w.T), lam * w @ omega
        for t in range(m):
            z = ys[t] * (xs[t] @ w[:, t])
            value += np.logaddexp(0.0, -z).sum() / n
            grad[:, t] -= (ys[t] * np.exp(-np.logaddexp(0.0, z))) @ xs[t] / n
        return value, grad.ravel()

    found = minimize(objective, np.zeros(d * m), jac=True, method="L-BFGS-B",
                     options={"gtol": 1e-13, "ftol": 1e-15, "maxiter": 10_000})
    return found.x.reshape(d, m)


def test_at_a_fixed_coupled_sigma_mocha_matches_an_independent_primal_solver():
    parts = tasks()
    sigma = np.array([[0.5, 0.2, 0.1], [0.2, 0.3, 0.05], [0.1, 0.05, 0.2]])
    clients = clients_of(parts)
    result = Mocha(loss="logistic", lam=0.05, local_steps=60, omega_every=0).fit(
        clients, rounds=150, rng=np.random.default_rng(1), sigma=sigma)
    gap = result.rounds[-1].gap
    assert -1e-12 <= gap < 1e-9
    np.testing.assert_allclose(result.w, dual_map(clients, sigma, 0.05), atol=1e-12)
    np.testing.assert_allclose(result.w, reference(parts, sigma, 0.05), atol=1e-4)


def test_the_task_covariance_is_the_normalised_matrix_square_root():
    w = np.random.default_rng(0).standard_normal((5, 3))
    root = np.real(sqrtm(w.T @ w))
    np.testing.assert_allclose(task_covariance(w), root / np.trace(root), atol=1e-10)
    rank_one = task_covariance(np.outer(np.ones(4), [1.0, 2.0, 0.0]))
    assert np.linalg.eigvalsh(rank_one)[0] > 0 and np.isclose(np.trace(rank_one), 1.0)


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 6))
def test_sigma_prime_is_the_smallest_safe_bound(seed, m):
    a = np.random.default_rng(seed).standard_normal((m, m + 2))
    sigma = a @ a.T + 1e-3 * np.eye(m)
    s = safe_sigma_prime(sigma)
    slack = np.linalg.eigvalsh(s * np.diag(np.diag(sigma)) - sigma)
    assert 1.0 - 1e-9 <= s <= m + 1e-9
    assert slack[0] >= -1e-9 * s * sigma.max()
    assert abs(slack[0]) <= 1e-8 * s * sigma.max()


@settings(max_examples=12)
@given(seed=st.integers(0, 2**32 - 1), straggle=st.floats(0.0, 1.0),
       loss=st.sampled_from(["hinge", "logistic"]))
def test_no_straggler_pattern_lowers_the_dual_or_breaks_the_dual_map(seed, straggle, loss):
    parts = tasks(m=4, n=25, seed=seed % 5)
    clients = clients_of(parts)
    sigma = task_covariance(np.random.default_rng(seed).standard_normal((4, 4)))
    result = Mocha(loss=loss, lam=0.1, local_steps=20, omega_every=0, straggle=straggle).fit(
        clients, rounds=10, rng=np.random.default_rng(seed), sigma=sigma)
    duals = [r.dual for r in result.rounds]
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))
    assert all(r.gap >= -1e-12 for r in result.rounds)
    np.testing.assert_allclose(result.w, dual_map(clients, sigma, 0.1), atol=1e-12)


def test_stragglers_slow_mocha_down_but_it_still_converges():
    parts = tasks(m=4)
    gaps = {}
    for straggle in (0.0, 0.8):
        result = Mocha(loss="logistic", lam=0.05, local_steps=30, omega_every=0, straggle=straggle).fit(
            clients_of(parts), rounds=60, rng=np.random.default_rng(2))
        gaps[straggle] = [r.gap for r in result.rounds]
        assert sum(r.skipped for r in result.rounds) > 0 or straggle == 0.0
    assert gaps[0.8][-1] < 1e-3 * gaps[0.8][0]
    assert gaps[0.0][9] < gaps[0.8][9]


def test_learning_omega_couples_related_tasks():
    parts = tasks(m=4, seed=3)
    result = Mocha(loss="logistic", lam=0.05, local_steps=40, omega_every=5).fit(
        clients_of(parts), rounds=20, rng=np.random.default_rng(0))
    off_diagonal = result.sigma - np.diag(np.diag(result.sigma))
    assert np.isclose(np.trace(result.sigma), 1.0)
    assert off_diagonal.max() > 0.05


@pytest.mark.parametrize("kwargs, key", [({"omega_every": -1}, "omega_every"),
                                         ({"straggle": 1.5}, "straggle"), ({"lam": -1.0}, "lam"),
                                         ({"loss": "l2"}, "loss")])
def test_bad_mocha_parameters_are_value_errors_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        Mocha(**kwargs)


def test_a_sigma_that_is_not_positive_definite_is_refused():
    with pytest.raises(ValueError, match="sigma"):
        Mocha().fit(clients_of(tasks(m=2)), rounds=1, rng=np.random.default_rng(0),
                    sigma=np.array([[1.0, 2.0], [2.0, 1.0]]))
