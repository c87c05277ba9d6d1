"""Federated evaluation through the real secure layers: counts come out exact after the fixed-point
encoding of masking and Paillier, the coordinator's figures depend only on the pooled records, and
a lying site (searched) can only make the evaluation fail or report figures a consistent set of
records would give."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fedsec.fl_core.aggregation import AggregationProtocol
from fedsec.fl_core.federated_eval import BINS, FederatedEvaluator, local_evaluation, sums_length
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.paillier import PaillierAggregation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from fedsec.errors import ConfigError
from fedsec.site_data import statistics_error_bound

MAX_WEIGHT = 400
"""The largest training split of the sites (the secure layer's public weight bound)."""


def sites(n_sites=4, seed=0, d=6):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_sites):
        x = rng.normal(size=(40 + 9 * k, d)).astype(np.float32)
        y = (x[:, 0] - 0.5 * x[:, 1] + rng.normal(size=len(x)) > 0).astype(np.int64)
        out.append(fl_core.ArrayDataset(x, y))
    return out


def pooled(tests):
    return fl_core.ArrayDataset(np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests]))


def model(seed=2):
    return fl_core.build_model("logreg", input_shape=(6,), n_classes=2, seed=seed)


def masking(n_sites=4, seed=5):
    return MaskedAggregation(max_weight=MAX_WEIGHT, rng=np.random.default_rng(seed), population=n_sites)


def paillier(seed=5):
    return PaillierAggregation(max_weight=MAX_WEIGHT, rng=np.random.default_rng(seed), key_bits=1024,
                               threshold=2, allow_insecure_key=True)


def evaluator(protocol, tests, kind):
    bound = statistics_error_bound(kind, sites=len(tests), max_weight=MAX_WEIGHT, length=sums_length(2))
    return FederatedEvaluator(protocol=protocol, test_sizes=[len(t) for t in tests], n_classes=2,
                              max_error=bound)


def exact_auroc(y, score):
    pos, neg = score[y == 1], score[y == 0]
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                 / (pos.size * neg.size))


@pytest.mark.parametrize("kind,make", [("masking", masking), ("paillier", paillier)])
def test_counts_are_exact_through_the_secure_layer(kind, make):
    import torch

    tests, net = sites(), model()
    result = evaluator(make(), tests, kind)(net, pooled(tests))
    everyone = pooled(tests)
    reference = fl_core.Evaluator()(net, everyone)
    assert result["eval_sites"] == 4 and result["eval_records"] == len(everyone)
    assert result["accuracy"] == reference["accuracy"]
    assert result["sensitivity"] == reference["sensitivity"]
    assert result["specificity"] == reference["specificity"]
    bound = statistics_error_bound(kind, sites=4, max_weight=MAX_WEIGHT, length=sums_length(2))
    assert 0 < bound < 1e-3
    assert abs(result["loss"] - reference["loss"]) <= bound / len(everyone) + 1e-6
    with torch.no_grad():
        score = torch.sigmoid(net(torch.from_numpy(everyone.x))[:, 0].double()).numpy()
    assert abs(result["auroc"] - exact_auroc(everyone.y, score)) <= result["auroc_bound"] + 1e-12


def test_the_coordinators_figures_depend_only_on_the_pooled_records():
    """Moving records between sites (same pooled records, different sites' sums) releases the same
    counts through masking: the coordinator cannot tell which site holds what."""
    tests, net = sites(), model()
    moved = [fl_core.ArrayDataset(np.concatenate([tests[0].x, tests[1].x[:20]]),
                                  np.concatenate([tests[0].y, tests[1].y[:20]])),
             tests[1].subset(np.arange(20, len(tests[1]))), tests[2], tests[3]]
    first = evaluator(masking(seed=1), tests, "masking")(net, pooled(tests))
    second = evaluator(masking(seed=2), moved, "masking")(net, pooled(moved))
    for key in ("accuracy", "sensitivity", "specificity", "auroc", "auroc_bound", "eval_records"):
        assert first[key] == second[key]


class Spy(AggregationProtocol):
    """Stands where the secure layer stands and records what each site hands it."""

    def __init__(self):
        self.calls = []

    def aggregate(self, round_index, updates, *, purpose="update"):
        self.calls.append((round_index, purpose, [(u.client_id, u.vector.copy(), u.weight)
                                                  for u in updates]))
        return fl_core.PlainAggregation().aggregate(round_index, updates, purpose=purpose)


def test_a_site_hands_the_secure_layer_its_sums_and_nothing_else():
    tests, net, spy = sites(), model(), Spy()
    FederatedEvaluator(protocol=spy, test_sizes=[len(t) for t in tests], n_classes=2)(net, pooled(tests))
    ((round_index, purpose, sent),) = spy.calls
    assert purpose == "statistics" and round_index == 1
    for (client, vector, weight), test in zip(sent, tests, strict=True):
        assert weight == 1.0 and vector.dtype == np.float64
        expected = local_evaluation(net, test, n_classes=2)
        np.testing.assert_array_equal(np.delete(vector, 2), np.delete(expected, 2))
        assert vector[2] == pytest.approx(expected[2], rel=1e-6)  # float32 forward, batch layout


LIES = st.one_of(
    st.lists(st.integers(-5, 60), min_size=sums_length(2), max_size=sums_length(2)),
    st.lists(st.floats(-1e6, 1e6), min_size=sums_length(2), max_size=sums_length(2)),
    st.builds(lambda k, v: (k, v), st.integers(0, sums_length(2) - 1), st.integers(-3, 3)),
)


class OneLiar(AggregationProtocol):
    """The honest masking layer, with site ``liar``'s vector replaced by ``lie`` (a full vector) or
    shifted at one entry ((index, change))."""

    def __init__(self, inner, liar, lie):
        self.inner, self.liar, self.lie = inner, liar, lie

    def aggregate(self, round_index, updates, *, purpose="update"):
        changed = []
        for u in updates:
            if u.client_id == self.liar:
                if isinstance(self.lie, tuple):
                    vector = u.vector.copy()
                    vector[self.lie[0]] += self.lie[1]
                else:
                    vector = np.asarray(self.lie, dtype=np.float64)
                u = fl_core.ClientUpdate(u.client_id, vector, u.weight)
            changed.append(u)
        return self.inner.aggregate(round_index, changed, purpose=purpose)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lie=LIES, liar=st.integers(0, 3))
def test_a_lying_site_is_refused_or_reports_figures_of_consistent_records(lie, liar):
    """Adversary: one site lies about its sums (random vectors, random one-entry shifts); the
    coordinator and the other sites are honest and unmodified. The evaluation either fails (NaN,
    eval_sites 0; the run goes on) or releases figures that a consistent set of records gives:
    rates in [0, 1], counts that add up."""
    tests, net = sites(), model()
    result = evaluator(OneLiar(masking(), liar, lie), tests, "masking")(net, pooled(tests))
    if result["eval_sites"] == 0:
        assert math.isnan(result["accuracy"])
        return
    for key in ("accuracy", "sensitivity", "specificity", "auroc"):
        assert math.isnan(result[key]) or 0 <= result[key] <= 1
    assert result["eval_records"] >= 0 and result["loss"] >= 0


def test_a_shifted_histogram_alone_is_refused():
    tests, net = sites(), model()
    lie = (7 + BINS + 3, 1)  # one more negative in a bin, no matching count
    result = evaluator(OneLiar(masking(), 2, lie), tests, "masking")(net, pooled(tests))
    assert result["eval_sites"] == 0 and math.isnan(result["accuracy"])


def test_an_encoding_too_coarse_for_exact_counts_is_refused_up_front(tmp_path):
    from fedsec.config import make_config
    from fedsec.site_data import build_evaluator

    assert statistics_error_bound("none", sites=1000, max_weight=2**40, length=10) == 0
    assert statistics_error_bound("masking", sites=100, max_weight=2**30, length=1031) >= 0.5
    config = make_config({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 1],
                          "data.clients": 100, "dp.mode": "none"})
    tests = [fl_core.ArrayDataset(np.zeros((1, 2), np.float32), np.zeros(1, np.int64))] * 100
    # a client of 2**30 records held as broadcast views (no memory): ArrayDataset would copy them
    # to canonical strides (16 GB), so the views are set on a small one; the evaluator reads len()
    big = fl_core.ArrayDataset(np.zeros((1, 2), np.float32), np.zeros(1, np.int64))
    object.__setattr__(big, "x", np.broadcast_to(np.float32(0), (2**30, 2)))
    object.__setattr__(big, "y", np.broadcast_to(np.int64(0), (2**30,)))
    data = fl_core.FederatedDataset(name="csv", clients=(big, *tests[1:]), test=pooled(tests),
                                    n_classes=2, input_shape=(2,), standardize=False,
                                    info={"test_sizes": [1] * 100})
    with pytest.raises(ConfigError) as caught:
        build_evaluator(config, data, masking(100))
    assert caught.value.key == "secure.aggregation" and "too coarse" in str(caught.value)
