"""A model's parameters as one flat float32 vector, and back, bit for bit.

Every protocol works on flat vectors; this module is the only place that knows how a
``torch.nn.Module`` lays its tensors out in that vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from fedsec.fl_core.errors import NonFiniteError, ShapeMismatchError
from torch import nn


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of a module's trainable tensors in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    size: int

    @classmethod
    def of(cls, model: nn.Module) -> ParameterLayout:
        names, shapes, offsets = [], [], []
        offset = 0
        for name, tensor in model.named_parameters():
            names.append(name)
            shapes.append(tuple(tensor.shape))
            offsets.append(offset)
            offset += tensor.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets), offset)


def get_vector(model: nn.Module) -> np.ndarray:
    """Return a copy of the model's parameters as one contiguous float32 vector."""
    with torch.no_grad():
        parts = [p.detach().reshape(-1).to(torch.float32) for p in model.parameters()]
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return torch.cat(parts).cpu().numpy().copy()


def set_vector(model: nn.Module, vector: np.ndarray) -> None:
    """Load a flat float32 vector into the model's parameters, in place.

    Raises:
        ShapeMismatchError: the vector is not one-dimensional of the model's parameter count.
        NonFiniteError: the vector holds NaN or infinity (the model is left untouched).
    """
    check_vector(vector, ParameterLayout.of(model).size, what="parameter vector")
    flat = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float32))
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


def check_vector(vector: np.ndarray, size: int, *, what: str = "vector") -> None:
    """Validate that ``vector`` is a finite 1-D array of ``size`` elements."""
    if not isinstance(vector, np.ndarray):
        raise ShapeMismatchError(f"{what} must be a numpy array, got {type(vector).__name__}")
    if vector.ndim != 1 or vector.shape[0] != size:
        raise ShapeMismatchError(f"{what} has shape {vector.shape}, expected ({size},)")
    if not np.isfinite(vector).all():
        raise NonFiniteError(f"{what} holds NaN or infinite values")
