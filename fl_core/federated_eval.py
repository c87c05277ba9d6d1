"""Federated evaluation: each site sums its own test metrics, the secure layer sums the sites.

One site computes :func:`local_evaluation` on its own held-out records: a fixed-length vector of
sums (layout in :func:`sums_length`)::

    [count, correct, summed loss]                          every task
    [TP, FP, TN, FN, positives' histogram, negatives' histogram]   two classes only

The histograms count the records of each true class by the positive-class logit (the log-odds
of the score P(class 1)) in :data:`BINS` fixed bins: :data:`BINS` - 2 bins of equal width on
[-:data:`LOGIT_RANGE`, :data:`LOGIT_RANGE`] and one open bin below and above. Every site's
vector is summed through the run's aggregation protocol with weight 1 and
``purpose="statistics"``; :func:`metrics_from_sums` turns the federation's sums into accuracy,
loss and (two classes) AUROC, sensitivity and specificity. The coordinator learns those sums,
never one site's.

Exactness: every entry but the summed loss is a whole number. A secure layer's fixed-point
encoding adds an error below ``max_error`` (the caller's bound for the protocol, < 0.5) to each
summed entry, so rounding to the nearest integer recovers the counts exactly, and accuracy,
sensitivity and specificity equal the pooled computation exactly. The loss is off by at most
``max_error / count``. AUROC from the binned histograms counts a positive-negative pair that
shares a bin as a tie (1/2); the exact AUROC (ties 1/2) differs from it by at most
``auroc_bound`` = sum_b pos_b neg_b / (2 P N), which every evaluation reports beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from fedsec.fl_core.aggregation import AggregationProtocol, ClientUpdate
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import AggregationError, InvalidParameterError
from fedsec.fl_core.history import RoundObserver
from fedsec.fl_core.local import default_loss
from fedsec.fl_core.models import predict
from torch import nn

BINS = 512
"""Score histogram bins per class (two-class tasks)."""

LOGIT_RANGE = 16.0
"""The equal-width bins cover logits in [-16, 16] (scores 1.1e-7 to 1 - 1.1e-7); two open bins
take the rest."""

BIN_EDGES = np.linspace(-LOGIT_RANGE, LOGIT_RANGE, BINS - 1)
"""The BINS - 1 inner edges; a logit z falls in bin ``searchsorted(BIN_EDGES, z, side="right")``."""

COMMON = ("count", "correct", "loss_sum")
BINARY = ("tp", "fp", "tn", "fn")
ATTEMPTS = 3
"""An aborted evaluation aggregation (e.g. too many dropouts) is retried up to this many times."""


def sums_length(n_classes: int) -> int:
    """Length of a site's sums vector for ``n_classes`` classes (>= 2)."""
    if n_classes < 2:
        raise InvalidParameterError(f"n_classes must be >= 2, got {n_classes}")
    return len(COMMON) + (len(BINARY) + 2 * BINS if n_classes == 2 else 0)


def _positive_logit(logits: torch.Tensor) -> np.ndarray:
    z = logits.detach().to(torch.float64)
    if z.shape[1] == 1:
        return z[:, 0].cpu().numpy()
    return (z[:, 1] - z[:, 0]).cpu().numpy()


@torch.no_grad()
def local_evaluation(model: nn.Module, test: ArrayDataset, *, n_classes: int,
                     batch_size: int = 4096) -> np.ndarray:
    """What one site computes on its own test split: the sums vector (float64, see the module).

    Args:
        model: the global model; it must output one logit (two classes) or ``n_classes`` logits.
        test: the site's held-out records (may be empty: every sum is then 0).
        n_classes: number of declared classes, >= 2.
        batch_size: rows per forward pass (memory only), >= 1.
    """
    length = sums_length(n_classes)
    if batch_size < 1:
        raise InvalidParameterError(f"batch_size must be >= 1, got {batch_size}")
    sums = np.zeros(length, dtype=np.float64)
    if len(test) == 0:
        return sums
    model.eval()
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)
    logits = torch.cat([model(x[i:i + batch_size]) for i in range(0, len(test), batch_size)])
    units = int(logits.shape[1])
    if units != n_classes and not (n_classes == 2 and units == 1):
        raise InvalidParameterError(f"the model outputs {units} logits for {n_classes} classes")
    predicted = predict(logits).cpu().numpy()
    truth = test.y
    sums[0] = len(test)
    sums[1] = np.count_nonzero(predicted == truth)
    sums[2] = float(default_loss(logits, y).to(torch.float64).sum())
    if n_classes == 2:
        positive, said = truth == 1, predicted == 1
        sums[3] = np.count_nonzero(positive & said)
        sums[4] = np.count_nonzero(~positive & said)
        sums[5] = np.count_nonzero(~positive & ~said)
        sums[6] = np.count_nonzero(positive & ~said)
        bins = np.searchsorted(BIN_EDGES, _positive_logit(logits), side="right")
        start = len(COMMON) + len(BINARY)
        sums[start:start + BINS] = np.bincount(bins[positive], minlength=BINS)
        sums[start + BINS:] = np.bincount(bins[~positive], minlength=BINS)
    return sums


def binned_auroc(positives: np.ndarray, negatives: np.ndarray) -> tuple[float, float]:
    """(AUROC, its largest error) from per-bin counts of positives and negatives (bins in
    increasing score order): pairs in different bins are ordered, pairs sharing a bin count 1/2.
    NaN for both when a class has no records."""
    p, n = float(positives.sum()), float(negatives.sum())
    if p == 0 or n == 0:
        return math.nan, math.nan
    below = np.cumsum(negatives) - negatives
    wins = float(np.sum(positives * (below + 0.5 * negatives)))
    return wins / (p * n), 0.5 * float(np.sum(positives * negatives)) / (p * n)


def metrics_from_sums(sums: np.ndarray, *, n_classes: int, max_error: float = 0.0) -> dict[str, float]:
    """The federation's metrics from its summed vector.

    Returns ``accuracy``, ``loss``, ``eval_records``; with two classes also ``auroc``,
    ``auroc_bound`` (its largest error from binning), ``sensitivity`` (TP / (TP + FN)) and
    ``specificity`` (TN / (TN + FP)); NaN where a denominator is 0.

    Args:
        sums: the summed vector (:func:`sums_length` entries), as decoded by the protocol.
        n_classes: number of classes, >= 2.
        max_error: the protocol's bound on each summed entry's error, in [0, 0.5).

    Raises:
        AggregationError: the sums are not what honest sites send: the wrong length, a count
            farther than ``max_error`` from a whole number, a negative count or loss, more correct
            than records, or (two classes) a confusion matrix or histograms that disagree with the
            counts.
    """
    if not 0 <= max_error < 0.5:
        raise InvalidParameterError(f"max_error must be in [0, 0.5), got {max_error}")
    sums = np.asarray(sums, dtype=np.float64)
    if sums.shape != (sums_length(n_classes),) or not np.isfinite(sums).all():
        raise AggregationError("evaluation sums have the wrong length or are not finite")
    counts = np.delete(sums, 2)
    whole = np.rint(counts)
    if np.any(np.abs(counts - whole) > max_error + 1e-9) or np.any(whole < 0):
        raise AggregationError("evaluation counts are not whole numbers within the protocol's "
                               "error bound")
    count, correct = whole[0], whole[1]
    consistent = correct <= count and sums[2] >= -max_error
    if n_classes == 2:
        tp, fp, tn, fn = whole[2:6]
        start = len(COMMON) + len(BINARY) - 1
        consistent = (consistent and tp + fp + tn + fn == count and tp + tn == correct
                      and whole[start:start + BINS].sum() == tp + fn
                      and whole[start + BINS:].sum() == fp + tn)
    if not consistent:
        raise AggregationError("evaluation sums are inconsistent (counts, confusion matrix and "
                               "histograms disagree)")
    result = {"eval_records": float(count),
              "accuracy": correct / count if count else math.nan,
              "loss": max(float(sums[2]), 0.0) / count if count else math.nan}
    if n_classes == 2:
        auroc, bound = binned_auroc(whole[start:start + BINS], whole[start + BINS:])
        result.update({
            "auroc": auroc, "auroc_bound": bound,
            "sensitivity": tp / (tp + fn) if tp + fn else math.nan,
            "specificity": tn / (tn + fp) if tn + fp else math.nan,
        })
    return result



def sum_evaluations(protocol: AggregationProtocol, round_index: int, updates: Sequence[ClientUpdate], *,
                    n_classes: int, max_error: float, attempts: int = ATTEMPTS) -> dict[str, float]:
    """Sum the sites' evaluation vectors through ``protocol`` (``purpose="statistics"``) and return
    the federation's metrics plus ``eval_sites`` and ``eval_upload_bytes``; an aborted or clipped
    sum is retried up to ``attempts`` times in all (>= 1), then the metrics are NaN and
    ``eval_sites`` is 0. A deployment passes 1: its sites never contribute one vector twice."""
    failed = {"accuracy": math.nan, "loss": math.nan, "eval_sites": 0.0}
    if not updates:
        return failed
    for _ in range(attempts):
        try:
            result = protocol.aggregate(round_index, updates, purpose="statistics")
            if result.metrics.get("clipped", 0) > 0:
                raise AggregationError("evaluation sums exceed the protocol's statistics range")
            metrics = metrics_from_sums(result.weighted_sum, n_classes=n_classes, max_error=max_error)
        except AggregationError:
            continue
        metrics["eval_sites"] = float(len(result.participants))
        metrics["eval_upload_bytes"] = float(result.upload_bytes)
        return metrics
    return failed

class FederatedEvaluator(RoundObserver):
    """The server loop's ``evaluator=``: each site evaluates on its own split, the protocol sums.

    Called as ``evaluator(model, test)`` by :class:`fl_core.FederatedServer`, where ``test`` is
    the concatenation of the sites' test splits in client order (as the server holds it after
    its feature scaling): it is cut back into the sites' splits by ``test_sizes``. Added to the
    server's observers too, it uses the loop's round number as the aggregation's round index
    (otherwise it counts its calls).

    Args:
        protocol: the run's aggregation protocol (its secure layer sums the sites' vectors).
        test_sizes: the number of test records of client k at position k (each >= 1).
        n_classes: number of classes, >= 2.
        max_error: the protocol's bound on each summed entry's error, in [0, 0.5) (0 for plain
            float64 sums; see the module for what it buys).
    """

    def __init__(self, *, protocol: AggregationProtocol, test_sizes: Sequence[int], n_classes: int,
                 max_error: float = 0.0) -> None:
        sizes = [int(s) for s in test_sizes]
        if not sizes or min(sizes) < 1:
            raise InvalidParameterError(f"test_sizes must be >= 1 for every client, got {sizes}")
        sums_length(n_classes)
        if not 0 <= max_error < 0.5:
            raise InvalidParameterError(f"max_error must be in [0, 0.5) for exact counts, got "
                                        f"{max_error}")
        self.protocol, self.test_sizes, self.n_classes = protocol, sizes, n_classes
        self.max_error = float(max_error)
        self._round = 0
        self._observed = False

    def before_round(self, round_index: int) -> str | None:
        self._round, self._observed = round_index, True
        return None

    def split(self, test: ArrayDataset) -> list[ArrayDataset]:
        """The sites' test splits from their concatenation."""
        if len(test) != sum(self.test_sizes):
            raise InvalidParameterError(f"the test split has {len(test)} records, the sites hold "
                                        f"{sum(self.test_sizes)}")
        cuts = np.cumsum(self.test_sizes)[:-1]
        return [ArrayDataset(x, y) for x, y in zip(np.split(test.x, cuts), np.split(test.y, cuts),
                                                    strict=True)]

    def evaluate_sites(self, model: nn.Module, tests: Sequence[ArrayDataset], *,
                       round_index: int) -> dict[str, float]:
        """Sum every site's :func:`local_evaluation` through the protocol; the metrics, plus
        ``eval_sites`` (sites in the sum) and ``eval_upload_bytes``. When every attempt aborts,
        the metrics are NaN and ``eval_sites`` is 0."""
        updates = [ClientUpdate(k, local_evaluation(model, t, n_classes=self.n_classes), 1.0)
                   for k, t in enumerate(tests)]
        return sum_evaluations(self.protocol, round_index, updates, n_classes=self.n_classes,
                               max_error=self.max_error)

    def __call__(self, model: nn.Module, test: ArrayDataset) -> dict[str, float]:
        if not self._observed:
            self._round += 1
        return self.evaluate_sites(model, self.split(test), round_index=self._round)
