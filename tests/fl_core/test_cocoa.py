"""CoCoA / CoCoA+: exactness against independent solvers, the primal-dual map, the gap, the seam.

Adversary played here: whoever decides which clients' Delta w reach the sum (the network, a
dropping or rejecting aggregation layer, a server that drops clients): the claim is that any such
choice keeps w = A alpha and never lowers the dual (CoCoA+ adding is safe for every subset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from fedsec.fl_core import AggregateResult, AggregationProtocol, ClientUpdate, PlainAggregation
from fedsec.fl_core.cocoa import CoCoA, CoCoAClient, primal_objective
from fedsec.fl_core.duality import HingeLoss, LogisticLoss, signed_labels, with_intercept
from fedsec.fl_core.errors import AggregationError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from sklearn.svm import LinearSVC


def blobs(n: int = 120, d: int = 4, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    y = (x @ rng.standard_normal(d) + 0.5 * rng.standard_normal(n) > 0).astype(np.int64)
    parts = np.array_split(rng.permutation(n), k)
    return x, y, [(x[p], y[p]) for p in parts]


def clients_of(parts) -> list[CoCoAClient]:
    return [CoCoAClient(client_id=k, x=x, y=y) for k, (x, y) in enumerate(parts)]


def dual_map(clients: Sequence[CoCoAClient], lam: float) -> np.ndarray:
    x = np.vstack([c.x for c in clients])
    ay = np.concatenate([c.alpha * c.y for c in clients])
    return ay @ x / (lam * x.shape[0])


class SubsetServer(AggregationProtocol):
    """The adversary deciding whose Delta w is summed: it keeps the clients ``keep(round)`` names,
    sums them honestly and reports exactly those as participants (statistics pass untouched)."""

    name = "subset"

    def __init__(self, keep) -> None:
        self.keep = keep

    def aggregate(self, round_index, updates, *, purpose="update"):
        kept = updates if purpose == "statistics" else [u for u in updates
                                                         if u.client_id in self.keep(round_index)]
        if not kept:
            raise AggregationError("no client kept")
        total = sum(u.weight * u.vector.astype(np.float64) for u in kept)
        return AggregateResult(weighted_sum=total, total_weight=sum(u.weight for u in kept),
                               participants=tuple(u.client_id for u in kept),
                               dropped=tuple(u.client_id for u in updates if u not in kept))


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
@pytest.mark.parametrize("combine", ["adding", "averaging"])
def test_the_server_model_is_exactly_the_dual_map_of_the_clients_alphas(loss, combine):
    _, _, parts = blobs()
    clients = clients_of(parts)
    result = CoCoA(loss=loss, lam=0.05, local_steps=30, combine=combine).fit(
        clients, PlainAggregation(), rounds=8, rng=np.random.default_rng(1))
    np.testing.assert_allclose(result.w, dual_map(clients, 0.05), rtol=0, atol=1e-13)
    assert all(0.0 <= a <= 1.0 for c in clients for a in c.alpha)


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_the_gap_is_nonnegative_falls_and_bounds_the_suboptimality(loss):
    x, y, parts = blobs()
    lam = 0.05
    result = CoCoA(loss=loss, lam=lam, local_steps=40).fit(clients_of(parts), PlainAggregation(),
                                                          rounds=40, rng=np.random.default_rng(2))
    gaps = np.array([r.gap for r in result.rounds])
    assert (gaps >= -1e-12).all()
    assert gaps[-1] < gaps[0] / 100
    assert gaps[-1] < 1e-3
    optimum = _reference_optimum(x, y, loss=loss, lam=lam)
    for r in result.rounds[::5]:
        assert r.primal - primal_objective(x, y, optimum, loss=loss, lam=lam) <= r.gap + 1e-9


def _reference_optimum(x, y, *, loss: str, lam: float) -> np.ndarray:
    n = len(y)
    if loss == "hinge":
        svm = LinearSVC(loss="hinge", C=1.0 / (lam * n), intercept_scaling=1.0, tol=1e-10,
                        max_iter=1_000_000, dual=True)
        svm.fit(x, y)
        return np.append(svm.coef_.ravel(), svm.intercept_[0])
    xi, s = with_intercept(x), signed_labels(y)

    def objective(w):
        z = s * (xi @ w)
        grad = -(s * np.exp(-np.logaddexp(0.0, z))) @ xi / n + lam * w
        return np.logaddexp(0.0, -z).mean() + 0.5 * lam * w @ w, grad

    return minimize(objective, np.zeros(xi.shape[1]), jac=True, method="L-BFGS-B",
                    options={"gtol": 1e-13, "ftol": 1e-15, "maxiter": 10_000}).x


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_federated_cocoa_matches_a_centralised_solver(loss):
    x, y, parts = blobs(n=90, d=3)
    lam = 0.1
    result = CoCoA(loss=loss, lam=lam, local_steps=60).fit(clients_of(parts), PlainAggregation(),
                                                          rounds=150, rng=np.random.default_rng(3))
    gap = result.rounds[-1].gap
    assert -1e-12 <= gap < 1e-7
    reference = _reference_optimum(x, y, loss=loss, lam=lam)
    # P is lambda-strongly convex: ||w - w*||^2 <= 2 (P(w) - P*) / lambda <= 2 gap / lambda
    assert np.linalg.norm(result.w - reference) <= np.sqrt(2 * max(gap, 0.0) / lam) + 1e-5


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), loss=st.sampled_from(["hinge", "logistic"]))
def test_whichever_clients_the_network_drops_w_stays_a_alpha_and_the_dual_never_falls(seed, loss):
    _, _, parts = blobs(n=60, d=3, k=4, seed=seed % 7)
    clients = clients_of(parts)
    pattern = np.random.default_rng(seed).random((12, 4)) < 0.5
    server = SubsetServer(lambda r: set(np.flatnonzero(pattern[r - 1]).tolist()))
    result = CoCoA(loss=loss, lam=0.1, local_steps=15).fit(clients, server, rounds=12,
                                                          rng=np.random.default_rng(seed))
    np.testing.assert_allclose(result.w, dual_map(clients, 0.1), rtol=0, atol=1e-13)
    duals = [r.dual for r in result.rounds if r.status == "ok"]
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))


@settings(max_examples=40)
@given(alpha=st.floats(0, 1), m=st.floats(-20, 20), q=st.floats(1e-3, 1e3))
@example(alpha=0.0, m=-2.75, q=46.0)  # plain Newton cycled between the sigmoid's tails here
def test_the_logistic_coordinate_step_maximises_its_one_dimensional_problem(alpha, m, q):
    a = LogisticLoss.maximize(alpha, m, q)

    def value(b):
        return LogisticLoss.dual(np.asarray(b)) - (b - alpha) * m - 0.5 * q * (b - alpha) ** 2

    grid = np.linspace(0.0, 1.0, 2001)
    assert 0.0 <= a <= 1.0
    assert value(a) >= value(grid).max() - 1e-9


@settings(max_examples=40)
@given(alpha=st.floats(0, 1), m=st.floats(-20, 20), q=st.floats(1e-3, 1e3))
def test_the_hinge_coordinate_step_maximises_its_one_dimensional_problem(alpha, m, q):
    a = HingeLoss.maximize(alpha, m, q)
    grid = np.linspace(0.0, 1.0, 2001)
    values = grid - (grid - alpha) * m - 0.5 * q * (grid - alpha) ** 2
    assert a - (a - alpha) * m - 0.5 * q * (a - alpha) ** 2 >= values.max() - 1e-9


def test_cocoa_through_pairwise_masking_tracks_the_plain_run_to_quantisation():
    from fedsec.protocols.masked import MaskedAggregation

    _, _, parts = blobs(n=80, d=3, k=4)
    runs = []
    for protocol in (PlainAggregation(),
                     MaskedAggregation(max_weight=40, rng=np.random.default_rng(5), clip=4.0, bits=24)):
        clients = clients_of(parts)
        result = CoCoA(loss="logistic", lam=0.1, local_steps=20).fit(
            clients, protocol, rounds=4, rng=np.random.default_rng(6))
        runs.append((result, clients))
    (plain, _), (masked, masked_clients) = runs
    np.testing.assert_allclose(masked.w, plain.w, atol=1e-4)
    np.testing.assert_allclose(masked.w, dual_map(masked_clients, 0.1), atol=1e-4)
    assert abs(masked.rounds[-1].gap - plain.rounds[-1].gap) < 1e-4


def test_cocoa_through_paillier_equals_the_plain_run_to_quantisation():
    from fedsec.protocols.paillier import PaillierAggregation

    _, _, parts = blobs(n=60, d=2, k=3)
    plain = CoCoA(loss="hinge", lam=0.1, local_steps=10).fit(
        clients_of(parts), PlainAggregation(), rounds=2, rng=np.random.default_rng(7))
    paillier = PaillierAggregation(max_weight=20, rng=np.random.default_rng(8), clip=4.0, bits=24,
                                   key_bits=1024, allow_insecure_key=True)
    secure = CoCoA(loss="hinge", lam=0.1, local_steps=10).fit(
        clients_of(parts), paillier, rounds=2, rng=np.random.default_rng(7))
    np.testing.assert_allclose(secure.w, plain.w, atol=1e-4)


def test_a_layer_that_would_clip_a_cocoa_message_is_refused():
    from fedsec.protocols.masked import MaskedAggregation

    _, _, parts = blobs(n=60, d=3, k=3)
    tight = MaskedAggregation(max_weight=20, rng=np.random.default_rng(0), clip=1e-3, bits=16)
    with pytest.raises(AggregationError, match="clip"):
        CoCoA(loss="hinge", lam=0.01, local_steps=20).fit(clients_of(parts), tight, rounds=1,
                                                         rng=np.random.default_rng(0))


@pytest.mark.parametrize("kwargs, key", [({"loss": "squared"}, "loss"), ({"lam": 0.0}, "lam"),
                                         ({"local_steps": 0}, "local_steps"),
                                         ({"combine": "sum"}, "combine")])
def test_bad_cocoa_parameters_are_value_errors_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        CoCoA(**kwargs)


def test_a_client_update_is_per_sample_scaled_with_weight_n_k():
    x, y, _ = blobs(n=30, d=2, k=1)
    client = CoCoAClient(client_id=0, x=x, y=y)
    update = client.propose(np.zeros(3), loss_name="hinge", lam=0.1, n_total=30, sigma_prime=1.0,
                            steps=10, rng=np.random.default_rng(0))
    assert isinstance(update, ClientUpdate) and update.weight == 30.0
    client.commit(1.0, included=True)
    np.testing.assert_allclose(update.vector * 30, dual_map([client], 0.1), atol=1e-15)


def test_a_gap_from_part_of_the_federation_is_not_reported():
    _, _, parts = blobs(n=60, d=3, k=3)

    class DropStatistics(SubsetServer):
        def aggregate(self, round_index, updates, *, purpose="update"):
            if purpose == "statistics":
                updates = updates[1:]
            return super().aggregate(round_index, updates, purpose="update")

    result = CoCoA(loss="hinge", lam=0.1, local_steps=10).fit(
        clients_of(parts), DropStatistics(lambda r: {0, 1, 2}), rounds=2, rng=np.random.default_rng(0))
    assert all(np.isnan(r.gap) for r in result.rounds)
    assert all(r.participants == 3 for r in result.rounds)


def test_clients_dropped_by_the_masking_layer_keep_their_old_block():
    from fedsec.protocols.masked import MaskedAggregation

    _, _, parts = blobs(n=160, d=3, k=8)
    clients = clients_of(parts)
    layer = MaskedAggregation(max_weight=20, rng=np.random.default_rng(3), clip=4.0, bits=24,
                              dropout=0.15)
    result = CoCoA(loss="logistic", lam=0.1, local_steps=15).fit(clients, layer, rounds=4,
                                                                rng=np.random.default_rng(12))
    assert any(r.status == "ok" and 0 < r.dropped for r in result.rounds)
    # a dropped client's Delta alpha is not applied: w = A alpha to quantisation (2^-24 x 4 per step),
    # where applying it would be off by that client's whole Delta w
    np.testing.assert_allclose(result.w, dual_map(clients, 0.1), atol=1e-4)


def test_federated_cocoa_reaches_the_centralised_sdca_solution():
    from fedsec.fl_core.cocoa import local_sdca

    x, y, parts = blobs(n=90, d=3)
    xi, s = with_intercept(x), signed_labels(y)
    alpha, w = np.zeros(len(s)), np.zeros(xi.shape[1])
    rng = np.random.default_rng(4)
    for _ in range(100):
        delta_alpha, delta_w = local_sdca(xi, s, alpha, w, loss_name="logistic", lam=0.1, n_total=90,
                                          sigma_prime=1.0, steps=90, rng=rng)
        alpha, w = alpha + delta_alpha, w + delta_w
    federated = CoCoA(loss="logistic", lam=0.1, local_steps=30).fit(
        clients_of(parts), PlainAggregation(), rounds=150, rng=np.random.default_rng(5))
    np.testing.assert_allclose(federated.w, w, atol=1e-6)
