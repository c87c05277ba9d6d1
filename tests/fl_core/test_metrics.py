"""Evaluator: accuracy, loss, AUROC, sensitivity, specificity, per-client accuracy, user metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedsec.fl_core import ArrayDataset, Evaluator
from fedsec.fl_core.errors import InvalidParameterError
from sklearn.metrics import roc_auc_score
from torch import nn


class Fixed(nn.Module):
    """Returns the first feature as the logit(s): the scores are chosen by the test."""

    def __init__(self, units: int) -> None:
        super().__init__()
        self.units = units

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : self.units]


def test_binary_metrics_from_a_hand_made_confusion_matrix():
    # logits > 0 predict 1. y = [1, 1, 1, 0, 0]; predictions [1, 1, 0, 0, 1]: TP 2, FN 1, TN 1, FP 1.
    logits = np.array([[2.0], [0.5], [-1.0], [-3.0], [0.1]], dtype=np.float32)
    y = np.array([1, 1, 1, 0, 0])
    result = Evaluator()(Fixed(1), ArrayDataset(logits, y))
    assert result["accuracy"] == pytest.approx(3 / 5)
    assert result["sensitivity"] == pytest.approx(2 / 3) and result["specificity"] == pytest.approx(1 / 2)
    p = 1 / (1 + np.exp(-logits[:, 0].astype(np.float64)))
    assert result["auroc"] == pytest.approx(roc_auc_score(y, p))
    expected_loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert result["loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_two_unit_models_get_binary_metrics_from_the_softmax():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2)).astype(np.float32)
    y = rng.integers(0, 2, 40)
    result = Evaluator()(Fixed(2), ArrayDataset(x, y))
    p1 = torch.softmax(torch.from_numpy(x).double(), 1)[:, 1].numpy()
    assert result["auroc"] == pytest.approx(roc_auc_score(y, p1))


def test_a_class_absent_from_the_test_set_gives_nan_not_a_number_made_up():
    x = np.array([[1.0], [2.0]], dtype=np.float32)
    result = Evaluator()(Fixed(1), ArrayDataset(x, np.array([1, 1])))
    assert math.isnan(result["auroc"]) and math.isnan(result["specificity"])
    assert result["sensitivity"] == 1.0


def test_user_metrics_see_labels_and_scores_only_and_groups_give_per_client_accuracy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 3)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    seen = {}

    def top1(y_true: np.ndarray, y_score: np.ndarray) -> float:
        seen["args"] = (y_true.copy(), y_score.copy())
        return float((y_score.argmax(1) == y_true).mean())

    groups = np.repeat([0, 1, 2], 10)
    result = Evaluator(metrics={"top1": top1}, groups=groups)(Fixed(3), ArrayDataset(x, y))
    correct = x.argmax(1) == y
    assert result["top1"] == pytest.approx(correct.mean()) == pytest.approx(result["accuracy"])
    for k in range(3):
        assert result[f"accuracy_client_{k}"] == pytest.approx(correct[groups == k].mean())
    y_true, y_score = seen["args"]
    np.testing.assert_array_equal(y_true, y)
    np.testing.assert_allclose(y_score.sum(1), 1.0)
    assert "auroc" not in result  # three classes: no binary metrics


def test_metric_names_and_callables_are_checked():
    with pytest.raises(InvalidParameterError, match="built in"):
        Evaluator(metrics={"auroc": lambda a, b: 0.0})
    with pytest.raises(InvalidParameterError, match="callable"):
        Evaluator(metrics={"mine": 3})
