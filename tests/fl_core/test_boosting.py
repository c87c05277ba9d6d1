"""Federated component-wise boosting equals an independent centralised implementation.

The reference below is written separately from ``fl_core.boosting``: scipy's B-spline design
matrix instead of the Cox-de Boor recursion, Brent's method on lambda instead of bisection,
least squares on the pooled design instead of summed normal equations, and the pooled data in one
array instead of per-client sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate
from fedsec.fl_core.boosting import BoostingSpec, FederatedBoosting
from fedsec.fl_core.boosting_learners import bspline_design, difference_penalty, lambda_for_df
from fedsec.fl_core.errors import AggregationError, InvalidParameterError
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.interpolate import BSpline
from scipy.optimize import brentq

from fedsec import fl_core


def reference_boosting(x: np.ndarray, y: np.ndarray, *, family: str, learners: str, nu: float,
                       mstop: int, df: float, knots: int, degree: int, diff: int, r: float,
                       selected: list[int] | None = None) -> np.ndarray:
    """Centralised component-wise boosting on pooled (x, y); returns [offset, coefficients...] and
    appends the selected learner of every iteration to ``selected``."""
    n, p = x.shape
    designs, penalties, dfs = [], [], []
    if learners in ("linear", "both"):
        for j in range(p):
            designs.append(np.column_stack([np.ones(n), x[:, j]]))
            penalties.append(np.zeros((2, 2)))
            dfs.append(None)
    if learners in ("spline", "both"):
        h = 2 * r / (knots + 1)
        t = np.linspace(-r - degree * h, r + degree * h, knots + 2 + 2 * degree)
        size = knots + degree + 1
        d = np.diff(np.eye(size), n=diff, axis=0)
        for j in range(p):
            clamped = np.clip(x[:, j], t[degree], t[-degree - 1])
            designs.append(BSpline.design_matrix(clamped, t, degree).toarray())
            penalties.append(d.T @ d)
            dfs.append(df)
    hats = []
    for design, pen, target in zip(designs, penalties, dfs, strict=True):
        gram = design.T @ design
        lam = 0.0
        if target is not None:
            def excess(log_lam: float, gram=gram, pen=pen, target=target) -> float:
                return np.trace(np.linalg.solve(gram + np.exp(log_lam) * pen, gram)) - target
            lam = float(np.exp(brentq(excess, -30, 40, xtol=1e-12)))
        hats.append((design, lam, pen))
    if family == "gaussian":
        offset = y.mean()
    else:
        offset = np.log(y.mean() / (1 - y.mean()))
    f = np.full(n, offset)
    coefs = [np.zeros(design.shape[1]) for design, _, _ in hats]
    for _ in range(mstop):
        u = y - f if family == "gaussian" else y - 1 / (1 + np.exp(-f))
        best = None
        for j, (design, lam, pen) in enumerate(hats):
            if lam == 0:
                beta = np.linalg.lstsq(design, u, rcond=None)[0]
            else:
                beta = np.linalg.solve(design.T @ design + lam * pen, design.T @ u)
            rss = float(np.sum((u - design @ beta) ** 2))
            if best is None or rss < best[0]:
                best = (rss, j, beta)
        _, j, beta = best
        if selected is not None:
            selected.append(j)
        coefs[j] = coefs[j] + nu * beta
        f = f + nu * (hats[j][0] @ beta)
    return np.concatenate([[offset], *coefs])


def standardised(seed: int = 0, clients: int = 4) -> fl_core.FederatedDataset:
    from fedsec.fl_core.standardize import apply_standardization, federated_moments

    data = fl_core.load_federated("breast_cancer", n_clients=clients, partition="iid",
                                  test_fraction=0.2, rng=np.random.default_rng(seed))
    mean, std, _ = federated_moments(data, fl_core.PlainAggregation())
    return apply_standardization(data, mean, std)


def pooled(data: fl_core.FederatedDataset, features: int) -> tuple[np.ndarray, np.ndarray]:
    both = data.pooled()
    return both.x[:, :features].astype(np.float64), both.y.astype(np.float64)


def narrow(data: fl_core.FederatedDataset, features: int) -> list[fl_core.ArrayDataset]:
    return [fl_core.ArrayDataset(c.x[:, :features], c.y) for c in data.clients]


SPEC = dict(nu=0.1, df=4.0, knots=20, degree=3, diff=2, r=3.0)


def spec_of(family: str, learners: str) -> BoostingSpec:
    return BoostingSpec(family=family, learners=learners, nu=SPEC["nu"], df=SPEC["df"],
                        inner_knots=SPEC["knots"], degree=SPEC["degree"],
                        difference=SPEC["diff"], spline_range=SPEC["r"])


def test_bspline_basis_equals_scipy() -> None:
    x = np.random.default_rng(1).uniform(-5, 5, 500)
    x[:3] = [-3.0, 3.0, 0.0]
    ours = bspline_design(x, low=-3, high=3, inner_knots=9, degree=3)
    h = 6 / 10
    t = np.linspace(-3 - 3 * h, 3 + 3 * h, 9 + 2 + 6)
    theirs = BSpline.design_matrix(np.clip(x, -3, 3), t, 3).toarray()
    np.testing.assert_allclose(ours, theirs, atol=1e-12)
    np.testing.assert_allclose(ours.sum(axis=1), 1.0, atol=1e-12)


def test_lambda_gives_the_degrees_of_freedom() -> None:
    x = np.random.default_rng(2).normal(size=300)
    design = bspline_design(x, low=-3, high=3, inner_knots=20, degree=3)
    gram, pen = design.T @ design, difference_penalty(24, 2)
    for df in (2.5, 4.0, 8.0):
        lam = lambda_for_df(gram, pen, df)
        assert np.trace(np.linalg.solve(gram + lam * pen, gram)) == pytest.approx(df, abs=1e-6)
    with pytest.raises(InvalidParameterError):
        lambda_for_df(gram, pen, 1.5)


@pytest.mark.parametrize(("family", "learners"),
                         [("binomial", "both"), ("gaussian", "both"), ("binomial", "linear"),
                          ("gaussian", "spline")])
def test_plain_federated_fit_equals_centralised(family: str, learners: str) -> None:
    data, features, mstop = standardised(), 8, 40
    fit = FederatedBoosting(spec=spec_of(family, learners), protocol=fl_core.PlainAggregation(),
                            iterations=mstop).fit(narrow(data, features))
    x, y = pooled(data, features)
    ref = reference_boosting(x, y, family=family, learners=learners, mstop=mstop, **SPEC)
    got = fit.model.flat_coefficients()
    assert np.abs(got - ref).max() < 1e-8
    assert np.abs(ref).max() > 0.05
    assert fit.path.shape == (mstop, got.size)
    np.testing.assert_allclose(fit.path[-1], got)


def test_masked_federated_fit_equals_centralised_up_to_quantisation() -> None:
    from fedsec.protocols.masked import MaskedAggregation

    data, features, mstop = standardised(), 6, 30
    clients = narrow(data, features)
    protocol = MaskedAggregation(max_weight=max(len(c) for c in clients),
                                 rng=np.random.default_rng(5))
    fit = FederatedBoosting(spec=spec_of("binomial", "both"), protocol=protocol,
                            iterations=mstop).fit(clients)
    x, y = pooled(data, features)
    selected: list[int] = []
    ref = reference_boosting(x, y, family="binomial", learners="both", mstop=mstop, selected=selected,
                             **SPEC)
    assert [step.selected for step in fit.steps] == selected
    assert np.abs(fit.model.flat_coefficients() - ref).max() < 1e-5
    assert fit.steps[0].upload_bytes > 0


def test_paillier_federated_fit_equals_centralised_up_to_quantisation() -> None:
    from fedsec.protocols.paillier import PaillierAggregation

    data, features, mstop = standardised(clients=3), 2, 5
    clients = narrow(data, features)
    protocol = PaillierAggregation(max_weight=max(len(c) for c in clients),
                                   rng=np.random.default_rng(6), threshold=2, key_bits=512,
                                   parties=range(3), allow_insecure_key=True)
    spec = BoostingSpec(family="gaussian", learners="both", inner_knots=4, df=3.0)
    fit = FederatedBoosting(spec=spec, protocol=protocol, iterations=mstop).fit(clients)
    x, y = pooled(data, features)
    selected: list[int] = []
    ref = reference_boosting(x, y, family="gaussian", learners="both", nu=0.1, mstop=mstop, df=3.0,
                             knots=4, degree=3, diff=2, r=3.0, selected=selected)
    assert [step.selected for step in fit.steps] == selected
    assert np.abs(fit.model.flat_coefficients() - ref).max() < 1e-5


@settings(max_examples=6, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=454), min_size=1, max_size=5, unique=True),
       seed=st.integers(min_value=0, max_value=2**16))
def test_fit_does_not_depend_on_how_the_samples_are_split(cuts: list[int], seed: int) -> None:
    """Any split of the pooled samples into clients (sizes and order searched) gives the pooled fit."""
    data = standardised()
    x, y = pooled(data, 5)
    order = np.random.default_rng(seed).permutation(len(y))
    parts = np.split(order, sorted(cuts))
    clients = [fl_core.ArrayDataset(x[i].astype(np.float32), y[i].astype(np.int64)) for i in parts]
    fit = FederatedBoosting(spec=spec_of("binomial", "both"), protocol=fl_core.PlainAggregation(),
                            iterations=15).fit(clients)
    ref = reference_boosting(x.astype(np.float32).astype(np.float64), y, family="binomial",
                             learners="both", mstop=15, **SPEC)
    assert np.abs(fit.model.flat_coefficients() - ref).max() < 1e-8


class FlakyProtocol(AggregationProtocol):
    """Plain sums that leave out client 0 for the first ``misses`` calls (a dropout)."""

    def __init__(self, misses: int) -> None:
        self.inner, self.misses = fl_core.PlainAggregation(), misses

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: str = "update") -> AggregateResult:
        if self.misses > 0:
            self.misses -= 1
            updates = list(updates)[1:]
        return self.inner.aggregate(round_index, updates, purpose=purpose)


def test_a_sum_missing_a_client_is_retried_and_never_used() -> None:
    data = standardised()
    clients = narrow(data, 4)
    exact = FederatedBoosting(spec=spec_of("gaussian", "linear"), protocol=fl_core.PlainAggregation(),
                              iterations=5).fit(clients)
    retried = FederatedBoosting(spec=spec_of("gaussian", "linear"), protocol=FlakyProtocol(2),
                                iterations=5).fit(clients)
    np.testing.assert_array_equal(retried.model.flat_coefficients(), exact.model.flat_coefficients())
    with pytest.raises(AggregationError, match="every client"):
        FederatedBoosting(spec=spec_of("gaussian", "linear"), protocol=FlakyProtocol(3),
                          iterations=5).fit(clients)


def test_a_client_sending_nan_stops_the_fit_with_a_typed_error() -> None:
    data = standardised()
    clients = narrow(data, 3)
    bad = fl_core.ArrayDataset(np.full_like(clients[0].x, np.nan), clients[0].y)
    with pytest.raises(AggregationError):
        FederatedBoosting(spec=spec_of("gaussian", "linear"), protocol=fl_core.PlainAggregation(),
                          iterations=2).fit([bad, *clients[1:]])


@pytest.mark.parametrize(("key", "value"), [("family", "poisson"), ("learners", "trees"), ("nu", 0.0),
                                            ("nu", 1.5), ("df", 2.0), ("inner_knots", 0),
                                            ("degree", 0), ("spline_range", -1.0)])
def test_spec_refuses_bad_values_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(InvalidParameterError, match=key):
        BoostingSpec(**{key: value})


def test_selected_features_are_informative() -> None:
    """On breast cancer the first selected learners are the known strong predictors (worst radius,
    perimeter, area, concave points: features 20-27), not the weak ones (e.g. 9, 11, 14, 19)."""
    data = standardised()
    fit = FederatedBoosting(spec=spec_of("binomial", "linear"), protocol=fl_core.PlainAggregation(),
                            iterations=30).fit(data.clients)
    first = {step.learner for step in fit.steps[:10]}
    assert first & {f"linear(x{j})" for j in range(20, 28)}
    assert not first & {f"linear(x{j})" for j in (9, 11, 14, 19)}
    accuracy = float((fit.model.predict(data.test.x) == data.test.y).mean())
    assert accuracy > 0.9


def test_sums_beyond_the_secure_range_stop_the_fit_instead_of_being_clipped() -> None:
    """A client whose sums exceed the statistics encoder's range (|value| < 2^24) ends the fit with
    an AggregationError: a clipped Gram matrix would give a wrong model silently."""
    from fedsec.protocols.masked import MaskedAggregation

    data = standardised()
    clients = narrow(data, 2)
    huge = fl_core.ArrayDataset(clients[0].x * 1e4, clients[0].y)
    protocol = MaskedAggregation(max_weight=200, rng=np.random.default_rng(0))
    with pytest.raises(AggregationError, match="range"):
        FederatedBoosting(spec=spec_of("gaussian", "linear"), protocol=protocol,
                          iterations=2).fit([huge, *clients[1:]])
