"""The reference every clipping path is checked against: one example at a time, its full gradient,
clipped to ``bound`` in L2 norm, summed (parameters an example does not reach count as zero)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def cross_entropy_per_example(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def naive_clipped_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bound: float,
                      loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                      = cross_entropy_per_example) -> list[torch.Tensor]:
    """Sum over the examples of each one's gradient clipped to ``bound``, per trainable parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(loss(model(x[i:i + 1]), y[i:i + 1]).sum(), params,
                                    allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
        norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
        for t, g in zip(total, grads, strict=True):  # a zero gradient adds zero at any scale
            t += (min(1.0, bound / norm) if norm > 0 else 1.0) * g
    return total
