"""Client data in the forms users hold it, checked and turned into :class:`fl_core.ArrayDataset`.

Accepted forms of one client's data (or of a test set):

- an ``(x, y)`` pair of numpy arrays, torch tensors or nested lists;
- a ``torch.utils.data.Dataset`` whose items are ``(x_i, y_i)`` pairs;
- a pandas ``DataFrame`` together with the name of its label column, either as a
  ``(frame, "label")`` pair or with ``label=`` given once for all clients (pandas is optional:
  nothing here imports it; a frame is recognised by its ``columns`` and ``to_numpy``).

Every check names the party (``client 2``, ``test``, ``test of client 0``) and, for bad values,
the first offending row (0-based position): features must be numeric and finite; labels must be
integers in [0, n_classes) (a float label such as 0.5 is refused, never truncated; 1.0 is read as
1); every sample must have the shape the model takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsec.fl_core.data import ArrayDataset


def _is_frame(data: Any) -> bool:
    return hasattr(data, "columns") and hasattr(data, "to_numpy") and hasattr(data, "drop")


def _numpy(value: Any, who: str, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{who}: {what} cannot be read as an array ({error})") from None
    return array


def _from_frame(frame: Any, label: str | None, who: str) -> tuple[np.ndarray, np.ndarray]:
    if label is None:
        raise ValueError(f"{who}: a DataFrame needs its label column: pass (frame, 'column') or "
                         "label='column'")
    if label not in frame.columns:
        raise ValueError(f"{who}: label column {label!r} is not among the DataFrame's columns "
                         f"{list(frame.columns)[:10]}")
    features = frame.drop(columns=[label])
    bad = [c for c, kind in zip(features.columns, features.dtypes, strict=True)
           if not (np.issubdtype(np.dtype(kind), np.number) or np.dtype(kind) == np.bool_)]
    if bad:
        raise ValueError(f"{who}: feature columns {bad} are not numeric (encode them first)")
    return features.to_numpy(dtype=np.float64), frame[label].to_numpy()


def _from_dataset(dataset: torch.utils.data.Dataset, who: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(dataset, torch.utils.data.TensorDataset) and len(dataset.tensors) == 2:
        return _numpy(dataset.tensors[0], who, "x"), _numpy(dataset.tensors[1], who, "y")
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{who}: a torch Dataset must have a length") from None
    xs, ys = [], []
    for i in range(n):
        item = dataset[i]
        if not (isinstance(item, Sequence) and len(item) == 2):
            raise ValueError(f"{who}, row {i}: a Dataset item must be an (x, y) pair")
        xs.append(_numpy(item[0], f"{who}, row {i}", "x"))
        ys.append(_numpy(item[1], f"{who}, row {i}", "y"))
    if not xs:
        raise ValueError(f"{who}: holds no samples")
    shapes = {a.shape for a in xs}
    if len(shapes) > 1:
        raise ValueError(f"{who}: Dataset samples have different shapes {sorted(shapes)[:3]}")
    return np.stack(xs), np.stack(ys)


def raw_arrays(data: Any, who: str, *, label: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as numpy arrays from any accepted form, unchecked beyond the form."""
    if isinstance(data, tuple) and len(data) == 2 and _is_frame(data[0]) and isinstance(data[1], str):
        return _from_frame(data[0], data[1], who)
    if _is_frame(data):
        return _from_frame(data, label, who)
    if isinstance(data, torch.utils.data.Dataset):
        return _from_dataset(data, who)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _numpy(data[0], who, "x"), _numpy(data[1], who, "y")
    raise ValueError(f"{who}: expected an (x, y) pair, a torch Dataset, or a DataFrame with a label "
                     f"column; got {type(data).__name__}")


def check_labels(y: np.ndarray, n_classes: int, who: str) -> np.ndarray:
    """Labels as int64 class indices, or a ValueError naming the first bad row."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"{who}: labels must be one class index per row, got shape {y.shape}")
    if y.dtype == np.bool_:
        y = y.astype(np.int64)
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise ValueError(f"{who}: labels must be integers in [0, {n_classes}), got dtype {y.dtype}")
    if np.issubdtype(y.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"{who}, row {row}: label {y[row].item()!r} is not an integer (labels must be "
                             f"class indices in [0, {n_classes}); {bad.size} such row(s))")
    outside = np.flatnonzero((y < 0) | (y >= n_classes))
    if outside.size:
        row = int(outside[0])
        raise ValueError(f"{who}, row {row}: label {y[row].item()!r} is outside [0, {n_classes}) (the model "
                         f"has {n_classes} classes; {outside.size} such row(s))")
    return y.astype(np.int64)


def check_features(x: np.ndarray, who: str) -> np.ndarray:
    """Features as float32, or a ValueError naming the first row with NaN or infinity."""
    if x.dtype == np.bool_:
        x = x.astype(np.float32)
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{who}: features must be numeric, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{who}: x must have one row per sample (at least 2 dimensions), got "
                         f"shape {x.shape}")
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{who}, row {row}: features hold NaN or infinity "
                         f"({int((~finite).sum())} such row(s))")
    if np.abs(x).max(initial=0.0) > np.finfo(np.float32).max:
        raise ValueError(f"{who}: features exceed the float32 range")
    return x.astype(np.float32)


def model_classes(model: nn.Module, sample: np.ndarray, who: str) -> int:
    """Number of classes the model predicts (1 output unit = 2 classes), found by running it on
    one sample of ``who``; a ValueError if the model cannot take that sample's shape."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(sample[:1]))
    except Exception as error:  # the user's model raises whatever torch raises
        raise ValueError(f"{who}: the model cannot take samples of shape {sample.shape[1:]} "
                         f"({type(error).__name__}: {error})") from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 1:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the model must map a batch to logits of shape [batch, units]; on one "
                         f"sample of {who} it returned {shape}")
    units = int(out.shape[1])
    return 2 if units == 1 else units


def to_dataset(data: Any, who: str, *, n_classes: int, sample_shape: tuple[int, ...] | None,
               label: str | None = None) -> ArrayDataset:
    """One party's checked data set; ``sample_shape`` None skips the shape comparison."""
    x, y = raw_arrays(data, who, label=label)
    if x.shape[:1] != y.shape[:1]:
        raise ValueError(f"{who}: x has {x.shape[0] if x.ndim else 0} rows but y has "
                         f"{y.shape[0] if y.ndim else 0}")
    if len(y) == 0:
        raise ValueError(f"{who}: holds no samples")
    x = check_features(x, who)
    if sample_shape is not None and tuple(x.shape[1:]) != sample_shape:
        raise ValueError(f"{who}: samples have shape {tuple(x.shape[1:])}, the model takes "
                         f"{sample_shape} (as client 0's)")
    return ArrayDataset(x, check_labels(y, n_classes, who))
