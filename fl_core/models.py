"""The bundled torch models and the one loss/prediction rule they share.

A model maps a float32 batch to logits. Binary tasks (two classes) use a single logit and
the logistic loss, so ``logreg`` on a binary task is exactly logistic regression with one weight
vector and an intercept; more classes use softmax cross-entropy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from fedsec.fl_core.errors import InvalidParameterError
from torch import nn
from torch.nn import functional as F

MODEL_NAMES = ("logreg", "mlp", "cnn")


def output_units(n_classes: int) -> int:
    """Logit count for a task with ``n_classes`` classes (>= 2): one for binary, else one per class."""
    if n_classes < 2:
        raise InvalidParameterError(f"n_classes must be >= 2, got {n_classes}")
    return 1 if n_classes == 2 else n_classes


class LogisticRegression(nn.Module):
    """Linear model on the flattened input: binary logistic or multinomial (softmax) regression."""

    def __init__(self, n_inputs: int, n_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_inputs, output_units(n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """McMahan et al.'s "2NN": two hidden layers of ``hidden`` ReLU units (200 by default)."""

    def __init__(self, n_inputs: int, n_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_inputs, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, output_units(n_classes)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """A CNN for small square images (8x8 digits): 5x5 conv, pool, 3x3 conv, pool, dense, dense.

    No batch normalisation, so per-sample gradients (DP-SGD) are well defined.
    """

    def __init__(self, in_channels: int, side: int, n_classes: int) -> None:
        super().__init__()
        if side < 4 or side % 4:
            raise InvalidParameterError(f"cnn needs a square image side divisible by 4, got {side}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 32 * (side // 4) ** 2
        self.classifier = nn.Sequential(
            nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, output_units(n_classes))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def build_model(
    name: str, *, input_shape: Sequence[int], n_classes: int, seed: int
) -> nn.Module:
    """Build a freshly initialised model; the same ``seed`` gives the same initial weights.

    Args:
        name: one of ``MODEL_NAMES``.
        input_shape: shape of one sample, e.g. ``(30,)`` or ``(1, 8, 8)``.
        n_classes: number of classes, >= 2.
        seed: initialisation seed, 0 <= seed < 2**63.
    """
    if name not in MODEL_NAMES:
        raise InvalidParameterError(f"model name must be one of {MODEL_NAMES}, got {name!r}")
    shape = tuple(int(s) for s in input_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "logreg":
            return LogisticRegression(math.prod(shape), n_classes)
        if name == "mlp":
            return MLP(math.prod(shape), n_classes)
        if len(shape) != 3 or shape[1] != shape[2]:
            raise InvalidParameterError(
                f"model 'cnn' needs image samples shaped (channels, side, side), got {shape}"
            )
        return SmallCNN(shape[0], shape[1], n_classes)


def classification_loss(logits: torch.Tensor, y: torch.Tensor, *, reduction: str = "mean"
                        ) -> torch.Tensor:
    """Logistic loss for one logit, else softmax cross-entropy; the batch mean, or one loss per
    example with ``reduction="none"`` (what per-example clipping needs)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype),
                                                  reduction=reduction)
    return F.cross_entropy(logits, y, reduction=reduction)


class PerExampleClassificationLoss:
    """:func:`classification_loss` with ``reduction="none"`` (one loss per example), and its
    derivative in closed form, which DP-SGD's fast path uses instead of a backward pass through
    the loss (``value_and_grad``; the DP-SGD probe checks it against autograd)."""

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return classification_loss(logits, y, reduction="none")

    def value_and_grad(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(losses [B], d sum(losses) / d logits [B, K]) without autograd: sigmoid(z) - y for one
        logit, softmax(z) - onehot(y) for more, by the kernels torch's own backward runs
        (``_log_softmax_backward_data``), so equal to autograd's to the bit. Raises where the
        loss itself would (a label out of range), IndexError or RuntimeError."""
        with torch.no_grad():
            if logits.shape[1] == 1:
                z, target = logits[:, 0], y.to(logits.dtype)
                losses = F.binary_cross_entropy_with_logits(z, target, reduction="none")
                return losses, torch.sigmoid(z).sub_(target).unsqueeze(1)
            log_p = F.log_softmax(logits, dim=1)
            losses = F.nll_loss(log_p, y, reduction="none")
            nll_grad = torch.zeros_like(logits).scatter_(1, y.unsqueeze(1), -1.0)
            return losses, torch._log_softmax_backward_data(nll_grad, log_p, 1, logits.dtype)


per_example_classification_loss = PerExampleClassificationLoss()
"""The classification loss per example, with its closed-form derivative (what DP-SGD trains on)."""


def predict(logits: torch.Tensor) -> torch.Tensor:
    """Predicted class indices from logits (threshold 0 for one logit, else argmax)."""
    if logits.shape[1] == 1:
        return (logits[:, 0] > 0).long()
    return logits.argmax(dim=1)


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Return ``(accuracy, mean loss)`` of ``model`` on the arrays ``x`` and ``y``."""
    model.eval()
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)
    logits = model(xt)
    loss = float(classification_loss(logits, yt))
    accuracy = float((predict(logits) == yt).double().mean())
    return accuracy, loss
