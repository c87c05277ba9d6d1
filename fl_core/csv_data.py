"""One site's data from a CSV file: the schema, validation before use, and the held-out split.

A site's file has a header row naming its columns; the schema (:class:`CsvSchema`) names the label
column, the feature columns (in the model's input order) and the declared class values. A file is
read in chunks (:data:`CHUNK_ROWS` rows at a time, each converted in one pass and checked
with numpy) and checked completely
before anything is returned: a missing, extra, duplicated or unnamed column, a row with the wrong
number of fields, a feature value that is not a number, NaN or infinite or beyond the float32
range, a label outside the declared classes, an empty file, and too few rows to hold out a test
split each raise :class:`SiteDataError` naming the file, the row and the column.

Row numbers are those a spreadsheet shows: the header is row 1, the first data row is row 2.
Blank lines (and lines of empty fields only) are skipped but counted, so the number still
matches. Messages never quote a cell's
value (a message may be forwarded by the site's staff; the row and column find the cell).

The held-out split is a deterministic function of (seed, client index) (:func:`split_seed`), so a
simulation (``fedsec run``) and a deployed site split the same file identically.
"""

from __future__ import annotations

import csv
import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fedsec.fl_core.data import ArrayDataset, stratified_split
from fedsec.fl_core.errors import FLError, InvalidParameterError

CHUNK_ROWS = 65_536
"""Rows converted to numbers at a time (memory only: results do not depend on it)."""

SPLIT_TAG = 0x63737673706C6974
"""Domain separation of the split's random stream from every other stream drawn from the seed."""

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class SiteDataError(FLError, ValueError):
    """A site's data file does not match the schema; the message names file, row and column.

    Attributes:
        file: the file's path as given.
        row: the spreadsheet row (header = 1, first data row = 2), or None for the whole file.
        column: the column's name, or None when the problem is not one column's.
    """

    def __init__(self, file: str | Path, message: str, *, row: int | None = None,
                 column: str | None = None) -> None:
        where = [str(file)]
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {message}")
        self.file, self.row, self.column = str(file), row, column


def _check_names(names: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InvalidParameterError(f"{what} must be a list of strings, got {names!r}")
    names = tuple(n.strip() for n in names)
    if any(not n for n in names):
        raise InvalidParameterError(f"{what} must not hold an empty name")
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"{what} names a value more than once: {list(names)}")
    return names


@dataclass(frozen=True)
class CsvSchema:
    """What every site's file must hold (the plan's ``data.label``, ``data.columns``,
    ``data.classes``).

    Attributes:
        label: name of the label column.
        classes: the declared label values, >= 2, as text; a cell matches class k when its
            stripped text equals ``classes[k]``, or when both read as the same number ("1.0"
            matches "1"). Class k is the model's class index k; for two classes ``classes[1]``
            is the positive class (AUROC, sensitivity).
        features: the feature columns in the model's input order; None = every column but the
            label, in the order of the file's header.
    """

    label: str
    classes: tuple[str, ...]
    features: tuple[str, ...] | None = None

    def __init__(self, *, label: str, classes: Sequence[str | int],
                 features: Sequence[str] | None = None) -> None:
        if not isinstance(label, str) or not label.strip():
            raise InvalidParameterError(f"label must be a non-empty column name, got {label!r}")
        if isinstance(classes, str) or any(isinstance(c, bool) or not isinstance(c, str | int)
                                           for c in classes):
            raise InvalidParameterError(f"classes must be a list of strings or integers, got "
                                        f"{classes!r}")
        declared = _check_names([str(c) for c in classes], "classes")
        if len(declared) < 2:
            raise InvalidParameterError(f"classes must declare at least 2 values, got {list(declared)}")
        numbers = [_as_number(c) for c in declared]
        known = [v for v in numbers if v is not None]
        if len(set(known)) != len(known):
            raise InvalidParameterError(f"classes names one number twice: {list(declared)}")
        names = None
        if features is not None:
            names = _check_names(features, "features")
            if not names:
                raise InvalidParameterError("features must name at least one column (or be None)")
            if label.strip() in names:
                raise InvalidParameterError(f"the label column {label.strip()!r} cannot be a feature")
        object.__setattr__(self, "label", label.strip())
        object.__setattr__(self, "classes", declared)
        object.__setattr__(self, "features", names)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def feature_names(self, header: Sequence[str]) -> tuple[str, ...]:
        """The feature columns for a file with this ``header`` (the declared ones, or every
        column but the label in header order)."""
        if self.features is not None:
            return self.features
        return tuple(h for h in header if h != self.label)


@dataclass(frozen=True)
class ClientData:
    """One site's records, split: ``train`` for local training, ``test`` for evaluation."""

    train: ArrayDataset
    test: ArrayDataset
    features: tuple[str, ...]
    """The feature columns, in the order of ``x``'s columns."""


def _as_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _header(path: str | Path, rows: Iterator[list[str]], schema: CsvSchema
            ) -> tuple[tuple[str, ...], list[int], int]:
    """(feature names, their positions, label position) from the header row, or SiteDataError."""
    header = next(rows, None)
    if header is None or not any(cell.strip() for cell in header):
        raise SiteDataError(path, "the file is empty (no header row naming the columns)", row=1)
    names = [cell.strip() for cell in header]
    for position, name in enumerate(names):
        if not name:
            raise SiteDataError(path, f"the header's field {position + 1} has no column name", row=1)
        if names.index(name) != position:
            raise SiteDataError(path, "the header names this column twice", row=1, column=name)
    features = schema.feature_names(names)
    wanted = (schema.label, *features)
    for name in wanted:
        if name not in names:
            raise SiteDataError(path, "is missing from the header", row=1, column=name)
    for name in names:
        if name not in wanted:
            raise SiteDataError(path, "is in the header but not in the schema (data.label, "
                                      "data.columns)", row=1, column=name)
    if not features:
        raise SiteDataError(path, "the file holds no feature column beside the label", row=1)
    return features, [names.index(f) for f in features], names.index(schema.label)


def _chunks(path: str | Path, rows: Iterator[list[str]], width: int
            ) -> Iterator[tuple[list[list[str]], np.ndarray]]:
    """(rows, spreadsheet row numbers [r]) per chunk of at most CHUNK_ROWS; blank rows skipped."""
    table: list[list[str]] = []
    numbers: list[int] = []
    for number, row in enumerate(rows, start=2):
        if not any(row):  # a blank line, or one of empty fields only
            continue
        if len(row) != width:
            raise SiteDataError(path, f"has {len(row)} fields, the header has {width}", row=number)
        table.append(row)
        numbers.append(number)
        if len(table) == CHUNK_ROWS:
            yield table, np.array(numbers, dtype=np.int64)
            table, numbers = [], []
    if table:
        yield table, np.array(numbers, dtype=np.int64)


def _features(path: str | Path, table: list[list[str]], numbers: np.ndarray, positions: list[int],
              names: tuple[str, ...]) -> np.ndarray:
    pick = operator.itemgetter(*positions) if len(positions) > 1 else (lambda row: (row[positions[0]],))
    try:
        flat = list(map(float, [cell for row in table for cell in pick(row)]))
    except ValueError:
        for r, row in enumerate(table):
            for c, cell in enumerate(pick(row)):
                if not _is_float(cell):
                    what = "is empty" if not cell.strip() else "is not a number"
                    raise SiteDataError(path, what, row=int(numbers[r]), column=names[c]) from None
        raise
    values = np.array(flat, dtype=np.float64).reshape(len(table), len(positions))
    bad = ~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX)
    if bad.any():
        r, c = (int(i[0]) for i in np.nonzero(bad))
        what = ("is NaN" if np.isnan(values[r, c]) else "is infinite" if np.isinf(values[r, c])
                else "exceeds the float32 range")
        raise SiteDataError(path, what, row=int(numbers[r]), column=names[c])
    return values.astype(np.float32)


def _is_float(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _labels(path: str | Path, table: list[list[str]], numbers: np.ndarray, at: int,
            schema: CsvSchema) -> np.ndarray:
    text = np.array([row[at].strip() for row in table], dtype=str)
    values, inverse = np.unique(text, return_inverse=True)
    by_text = {c: k for k, c in enumerate(schema.classes)}
    by_number = {v: k for k, c in enumerate(schema.classes) if (v := _as_number(c)) is not None}
    index = np.empty(values.size, dtype=np.int64)
    for u, value in enumerate(values.tolist()):
        k = by_text.get(value)
        if k is None:
            k = by_number.get(_as_number(value)) if _as_number(value) is not None else None
        if k is None:
            row = int(numbers[int(np.flatnonzero(inverse == u)[0])])
            what = "is empty" if not value else "is not one of the declared classes"
            raise SiteDataError(path, f"{what} (data.classes = {list(schema.classes)})", row=row,
                                column=schema.label)
        index[u] = k
    return index[inverse.reshape(-1)]


def read_site_csv(path: str | Path, schema: CsvSchema) -> tuple[ArrayDataset, tuple[str, ...]]:
    """Every data row of ``path`` as an :class:`ArrayDataset` (features float32 in the schema's
    order, labels as class indices), with the feature names; validated completely first.

    Raises:
        SiteDataError: the file cannot be read or does not match ``schema`` (see the module).
    """
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = csv.reader(handle, strict=True)
            features, positions, label_at = _header(path, rows, schema)
            for cells, numbers in _chunks(path, rows, len(positions) + 1):
                xs.append(_features(path, cells, numbers, positions, features))
                ys.append(_labels(path, cells, numbers, label_at, schema))
    except OSError as error:
        raise SiteDataError(path, f"cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise SiteDataError(path, "is not UTF-8 text (save it as CSV UTF-8)") from None
    except csv.Error as error:
        raise SiteDataError(path, f"is not valid CSV near line {rows.line_num} ({error})") from None
    if not xs:
        raise SiteDataError(path, "holds a header but no data rows")
    return ArrayDataset(np.concatenate(xs), np.concatenate(ys)), features


def split_seed(seed: int, index: int) -> np.random.SeedSequence:
    """The seed of client ``index``'s held-out split in a run seeded ``seed`` (both >= 0)."""
    if seed < 0 or index < 0:
        raise InvalidParameterError(f"seed and index must be >= 0, got {seed} and {index}")
    return np.random.SeedSequence(entropy=int(seed), spawn_key=(SPLIT_TAG, int(index)))


def load_client_csv(path: str | Path, schema: CsvSchema, *, test_fraction: float, seed: int,
                    index: int) -> ClientData:
    """Read and validate one site's file, then hold out a stratified ``test_fraction`` of it.

    Args:
        path: the site's CSV file (UTF-8, a header row, comma-separated).
        schema: the federation's schema.
        test_fraction: share of the rows held out for evaluation, in (0, 1).
        seed: the run's seed (``seed`` of the plan), >= 0.
        index: the client's index in the federation (its position in ``data.files``), >= 0.

    Raises:
        SiteDataError: the file fails validation, or holds too few rows for both sides.
    """
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError(f"test_fraction must be in (0, 1), got {test_fraction}")
    records, features = read_site_csv(path, schema)
    rng = np.random.default_rng(split_seed(seed, index))
    train, test = stratified_split(records.y, test_fraction=test_fraction, rng=rng)
    if train.size == 0 or test.size == 0:
        raise SiteDataError(path, f"{len(records)} data row(s) are too few to hold out a test "
                                  f"split of {test_fraction:g} (each side needs a row)")
    return ClientData(records.subset(train), records.subset(test), features)
