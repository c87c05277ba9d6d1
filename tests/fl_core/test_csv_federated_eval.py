"""Federated evaluation in fl_core: a site's sums, the metrics from the federation's sums, exact
counts against the pooled computation, and AUROC within its reported binning bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedsec.fl_core.errors import AggregationError
from fedsec.fl_core.federated_eval import (
    BIN_EDGES,
    BINS,
    FederatedEvaluator,
    binned_auroc,
    local_evaluation,
    metrics_from_sums,
    sums_length,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec import fl_core


def exact_auroc(y: np.ndarray, score: np.ndarray) -> float:
    """Mann-Whitney: P(score of a positive > score of a negative), ties counted 1/2 (no sklearn)."""
    pos, neg = score[y == 1], score[y == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (pos.size * neg.size))


def sites(n_sites=4, n=60, d=5, seed=0, classes=2):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_sites):
        x = rng.normal(size=(n + 7 * k, d)).astype(np.float32)
        y = (x[:, 0] + 0.8 * rng.normal(size=len(x)) > 0.3).astype(np.int64) if classes == 2 else \
            rng.integers(0, classes, size=len(x))
        out.append(fl_core.ArrayDataset(x, y))
    return out


def model_for(d=5, classes=2, seed=1):
    return fl_core.build_model("logreg", input_shape=(d,), n_classes=classes, seed=seed)


def pooled(tests):
    return fl_core.ArrayDataset(np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests]))


@pytest.mark.parametrize("classes", [2, 3])
def test_plain_federated_metrics_equal_the_pooled_evaluator(classes):
    tests, model = sites(classes=classes), model_for(classes=classes)
    evaluator = FederatedEvaluator(protocol=fl_core.PlainAggregation(), test_sizes=[len(t) for t in tests],
                                   n_classes=classes)
    federated = evaluator(model, pooled(tests))
    reference = fl_core.Evaluator()(model, pooled(tests))
    assert federated["accuracy"] == reference["accuracy"]
    assert federated["loss"] == pytest.approx(reference["loss"], rel=1e-6)
    assert federated["eval_records"] == sum(len(t) for t in tests) and federated["eval_sites"] == 4
    if classes == 2:
        assert federated["sensitivity"] == reference["sensitivity"]
        assert federated["specificity"] == reference["specificity"]
        assert abs(federated["auroc"] - reference["auroc"]) <= federated["auroc_bound"] + 1e-12
    else:
        assert "auroc" not in federated


def test_sums_layout_and_one_site():
    assert sums_length(2) == 3 + 4 + 2 * BINS and sums_length(5) == 3
    test, model = sites(1)[0], model_for()
    sums = local_evaluation(model, test, n_classes=2)
    assert sums[0] == len(test) and sums[3:7].sum() == len(test)
    assert sums[7:7 + BINS].sum() == (test.y == 1).sum()
    assert np.array_equal(local_evaluation(model, fl_core.ArrayDataset(test.x[:0], test.y[:0]),
                                           n_classes=2), np.zeros(sums_length(2)))
    with pytest.raises(fl_core.InvalidParameterError):
        local_evaluation(model, test, n_classes=3)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 80), scale=st.floats(0.01, 40.0),
       ties=st.booleans())
def test_binned_auroc_is_within_its_bound_of_the_exact_auroc(seed, n, scale, ties):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    y[0], y[1] = 0, 1
    logit = scale * rng.normal(size=n) + y * rng.normal()
    if ties:
        logit = np.round(logit)
    bins = np.searchsorted(BIN_EDGES, logit, side="right")
    auroc, bound = binned_auroc(np.bincount(bins[y == 1], minlength=BINS),
                                np.bincount(bins[y == 0], minlength=BINS))
    exact = exact_auroc(y, 1 / (1 + np.exp(-logit)))
    assert abs(auroc - exact) <= bound + 1e-12
    assert 0 <= bound <= 0.5


def test_auroc_bound_is_zero_when_no_positive_shares_a_bin_with_a_negative():
    positives, negatives = np.zeros(BINS), np.zeros(BINS)
    positives[[10, 300]] = [3, 2]
    negatives[[5, 200, 400]] = [1, 4, 1]
    auroc, bound = binned_auroc(positives, negatives)
    assert bound == 0 and auroc == pytest.approx((3 * 1 + 2 * 5) / (5 * 6))
    assert math.isnan(binned_auroc(positives, np.zeros(BINS))[0])


def _vector(counts):
    tp, fp, tn, fn = counts
    v = np.zeros(sums_length(2))
    v[:3] = [tp + fp + tn + fn, tp + tn, 1.5]
    v[3:7] = counts
    v[7 + 100] = tp + fn
    v[7 + BINS + 50] = fp + tn
    return v


def test_counts_are_recovered_from_sums_within_the_error_bound():
    v = _vector([3, 1, 4, 2])
    noisy = v + np.where(np.arange(v.size) == 2, 0.0, 0.3)
    assert metrics_from_sums(noisy, n_classes=2, max_error=0.31) == metrics_from_sums(v, n_classes=2)
    with pytest.raises(AggregationError):
        metrics_from_sums(noisy, n_classes=2, max_error=0.2)


@pytest.mark.parametrize("entry,change", [(0, 1), (1, 1), (3, 1), (7 + 100, -1), (7 + BINS + 50, 2),
                                          (2, -5), (4, -10)])
def test_inconsistent_sums_are_refused(entry, change):
    v = _vector([3, 1, 4, 2])
    v[entry] += change
    with pytest.raises(AggregationError):
        metrics_from_sums(v, n_classes=2)


def test_failed_evaluation_is_nan_and_the_evaluator_uses_the_loop_round():
    class Refuses(fl_core.AggregationProtocol):
        rounds: list[int] = []

        def aggregate(self, round_index, updates, *, purpose="update"):
            self.rounds.append(round_index)
            assert purpose == "statistics" and all(u.weight == 1 for u in updates)
            raise fl_core.TooFewClientsError(0, 3)

    tests = sites(3)
    protocol = Refuses()
    evaluator = FederatedEvaluator(protocol=protocol, test_sizes=[len(t) for t in tests], n_classes=2)
    evaluator.before_round(7)
    result = evaluator(model_for(), pooled(tests))
    assert math.isnan(result["accuracy"]) and result["eval_sites"] == 0
    assert protocol.rounds == [7, 7, 7]
    with pytest.raises(fl_core.InvalidParameterError):
        evaluator(model_for(), tests[0])
    with pytest.raises(fl_core.InvalidParameterError):
        FederatedEvaluator(protocol=protocol, test_sizes=[3, 0], n_classes=2)
    with pytest.raises(fl_core.InvalidParameterError):
        FederatedEvaluator(protocol=protocol, test_sizes=[3], n_classes=2, max_error=0.5)


def test_two_output_units_give_the_same_sums_as_one():
    test = sites(1)[0]
    one = model_for()
    torch.manual_seed(3)
    two = torch.nn.Linear(5, 2)
    for model in (one, two):
        sums = local_evaluation(model, test, n_classes=2)
        logits = model(torch.from_numpy(test.x)).detach()
        predicted = fl_core.models.predict(logits).numpy()
        assert sums[1] == (predicted == test.y).sum()
