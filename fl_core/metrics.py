"""Evaluation beyond accuracy: test loss, AUROC, sensitivity and specificity for binary tasks,
per-client accuracy, and user metrics ``fn(y_true, y_score) -> float``.

The server calls an :class:`Evaluator` with the global model and the test split; user metrics see
only labels and scores, never the model or the server.

Scores: for one output unit (binary logistic) ``y_score`` is P(class 1) = sigmoid(logit), a
vector; for k >= 2 output units it is the softmax, an ``[n, k]`` array (for k = 2 binary metrics
use column 1). The predicted class is the one :func:`fl_core.models.predict` picks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import torch
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.models import predict
from torch import nn

MetricFn = Callable[[np.ndarray, np.ndarray], float]
"""(y_true int64 [n], y_score float64 [n] or [n, k]) -> a number."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(outputs, targets) -> one loss per example."""

RESERVED = ("accuracy", "loss", "auroc", "sensitivity", "specificity")


def scores(logits: torch.Tensor) -> np.ndarray:
    """Class scores from logits: sigmoid of a single logit, else the softmax (float64)."""
    logits = logits.detach().to(torch.float64)
    if logits.shape[1] == 1:
        return torch.sigmoid(logits[:, 0]).cpu().numpy()
    return torch.softmax(logits, dim=1).cpu().numpy()


def binary_metrics(y_true: np.ndarray, y_pred: np.ndarray, p_one: np.ndarray) -> dict[str, float]:
    """AUROC of P(class 1), and sensitivity TP / (TP + FN) and specificity TN / (TN + FP) of the
    predicted classes; NaN where a class is absent from ``y_true``."""
    from sklearn.metrics import roc_auc_score

    positives, negatives = y_true == 1, y_true == 0
    both = bool(positives.any() and negatives.any())
    return {
        "auroc": float(roc_auc_score(y_true, p_one)) if both else math.nan,
        "sensitivity": float((y_pred[positives] == 1).mean()) if positives.any() else math.nan,
        "specificity": float((y_pred[negatives] == 0).mean()) if negatives.any() else math.nan,
    }


class Evaluator:
    """Evaluates a model on a test split; returns ``accuracy``, ``loss`` and the other metrics.

    Args:
        loss: per-example loss (default: the task's classification loss).
        metrics: user metrics by name (names must not clash with the built-in ones).
        groups: for per-client test data, the owning client of each test row; adds
            ``accuracy_client_<k>`` for every client k that has test rows.
        batch_size: rows per forward pass (memory only; results do not depend on it), >= 1.
    """

    def __init__(self, *, loss: LossFn | None = None, metrics: Mapping[str, MetricFn] | None = None,
                 groups: np.ndarray | None = None, batch_size: int = 4096) -> None:
        metrics = dict(metrics or {})
        for name, fn in metrics.items():
            if not isinstance(name, str) or not name or name in RESERVED:
                raise InvalidParameterError(f"metric name {name!r} is empty or built in {RESERVED}")
            if not callable(fn):
                raise InvalidParameterError(f"metric {name!r} must be callable fn(y_true, y_score)")
        if batch_size < 1:
            raise InvalidParameterError(f"batch_size must be >= 1, got {batch_size}")
        from fedsec.fl_core.local import default_loss

        self.loss = loss or default_loss
        self.metrics, self.groups, self.batch_size = metrics, groups, batch_size

    @torch.no_grad()
    def __call__(self, model: nn.Module, test: ArrayDataset) -> dict[str, float]:
        model.eval()
        x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)
        logits = torch.cat([model(x[i:i + self.batch_size]) for i in range(0, len(test),
                                                                            self.batch_size)])
        losses = self.loss(logits, y)
        predicted = predict(logits).cpu().numpy()
        correct = predicted == test.y
        result = {"accuracy": float(correct.mean()), "loss": float(losses.mean())}
        score = scores(logits)
        if logits.shape[1] <= 2:
            p_one = score if score.ndim == 1 else score[:, 1]
            result.update(binary_metrics(test.y, predicted, p_one))
        if self.groups is not None:
            for k in np.unique(self.groups).tolist():
                result[f"accuracy_client_{k}"] = float(correct[self.groups == k].mean())
        for name, fn in self.metrics.items():
            result[name] = float(fn(test.y.copy(), score.copy()))
        return result
