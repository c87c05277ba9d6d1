"""Round records, the training result, and the observer interface of the server loop."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HISTORY_COLUMNS = (
    "round",
    "accuracy",
    "loss",
    "epsilon",
    "delta",
    "participants",
    "dropped",
    "upload_bytes",
    "seconds",
)
"""The contract columns of ``history.csv``, in order; extra columns follow them (``epsilon_rdp``,
when present, sits right after ``epsilon``)."""

REAL_COLUMNS = frozenset({"accuracy", "loss", "epsilon", "epsilon_rdp", "delta", "seconds",
                          "train_loss", "update_norm", "budget_remaining", "noise_multiplier",
                          "sample_rate", "auroc", "auroc_bound", "sensitivity", "specificity"})
"""Columns that always hold real numbers; any other column whose every value is a whole number
is a counter and is written as integers (``3``, not ``3.0``)."""


@dataclass
class RoundRecord:
    """What happened in one round.

    Attributes:
        round: 1-based round number.
        accuracy, loss: the global model's test accuracy in [0, 1] and mean test loss after it.
        train_loss: mean of the local training losses the clients reported (NaN, a blank in
            ``history.csv``, when none did: a private run's clients report none).
        participants: clients whose updates are in the sum.
        dropped: sampled clients not in the sum (dropped out, failed, or rejected).
        upload_bytes: bytes sent by clients to the server this round.
        seconds: wall time of the round.
        update_norm: L2 norm of the change of the global parameter vector.
        status: ``ok``, or ``aborted: <reason>`` when no sum was released (model unchanged).
        metrics: extra values from the protocol and observers (numbers such as ``epsilon`` and
            ``delta``, or labels such as ``privacy_unit``).
    """

    round: int
    accuracy: float
    loss: float
    train_loss: float
    participants: int
    dropped: int
    upload_bytes: int
    seconds: float
    update_norm: float
    status: str = "ok"
    metrics: dict[str, float | str] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The record as one ``history.csv`` row (contract columns first, blanks where unknown)."""
        row: dict[str, Any] = {
            "round": self.round,
            "accuracy": _fmt(self.accuracy),
            "loss": _fmt(self.loss),
            "epsilon": _fmt(self.metrics.get("epsilon")),
            "delta": _fmt(self.metrics.get("delta")),
            "participants": self.participants,
            "dropped": self.dropped,
            "upload_bytes": self.upload_bytes,
            "seconds": f"{self.seconds:.4f}",
            "train_loss": _fmt(self.train_loss),
            "update_norm": _fmt(self.update_norm),
            "status": self.status,
        }
        for key in sorted(self.metrics):
            if key not in row:
                row[key] = _fmt(self.metrics[key])
        return row


def _fmt(value: float | str | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        return value
    return repr(float(value))


def _whole_numbers(cells: Iterable[str]) -> bool:
    """Whether every non-blank cell is a finite number without a fractional part."""
    seen = False
    for cell in cells:
        if cell == "":
            continue
        try:
            value = float(cell)
        except ValueError:
            return False
        if not math.isfinite(value) or not value.is_integer():
            return False
        seen = True
    return seen


@dataclass
class ResumePoint:
    """Where a checkpointed run continues: after round ``round``, at global vector ``vector``.

    Attributes:
        round: the last completed round (>= 0); the loop goes on with round ``round + 1``.
        vector: the global parameter vector after that round.
        records: the records of rounds 1..``round``.
        aborts_in_a_row: rounds without a sum at the end of ``records``.
    """

    round: int
    vector: np.ndarray
    records: list[RoundRecord]
    aborts_in_a_row: int = 0


@dataclass
class TrainingResult:
    """The outcome of :meth:`fl_core.server.FederatedServer.run`.

    Attributes:
        vector: the final global parameter vector (the last one every observer accepted).
        records: one record per round run.
        rounds_to_target: first round whose accuracy reached the target, or None.
        stop_reason: why the loop ended (``rounds``, ``target_accuracy``, ``stop_tol``,
            ``aborts``, ``interrupted`` (Ctrl-C; the round in flight is dropped), or the reason an
            observer gave).
    """

    vector: np.ndarray
    records: list[RoundRecord]
    rounds_to_target: int | None
    stop_reason: str

    @property
    def rounds_run(self) -> int:
        return len(self.records)

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].accuracy if self.records else float("nan")

    @property
    def best_accuracy(self) -> float:
        return max((r.accuracy for r in self.records), default=float("nan"))


class RoundObserver:
    """Hooks into the server loop; override what you need (all default to doing nothing).

    ``before_round`` may return a reason string to stop before the round starts (a privacy
    accountant uses this so the result is the last model within budget).
    """

    def on_start(self, *, n_clients: int, clients_per_round: int, rounds: int) -> None:
        """Called once before the first round."""

    def before_round(self, round_index: int) -> str | None:
        """Return a reason to stop before round ``round_index``, or None to go on."""
        return None

    def after_round(self, record: RoundRecord) -> None:
        """Called after each round; may add entries to ``record.metrics``."""

    def on_resume(self, point: ResumePoint) -> None:
        """Called once after ``on_start`` when the loop continues a checkpointed run."""

    def on_finish(self, result: TrainingResult) -> None:
        """Called once after the loop ends."""


class HistoryRecorder(RoundObserver):
    """Keeps every record and writes them as ``history.csv``."""

    def __init__(self) -> None:
        self.records: list[RoundRecord] = []

    def after_round(self, record: RoundRecord) -> None:
        self.records.append(record)

    def on_resume(self, point: ResumePoint) -> None:
        self.records = list(point.records)

    def write_csv(self, path: str | Path) -> None:
        """Write every record as one row (see :data:`HISTORY_COLUMNS` and :data:`REAL_COLUMNS`)."""
        rows = [r.row() for r in self.records]
        columns = list(HISTORY_COLUMNS)
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        if "epsilon_rdp" in columns:
            columns.remove("epsilon_rdp")
            columns.insert(columns.index("epsilon") + 1, "epsilon_rdp")
        for name in columns:
            if name not in REAL_COLUMNS and _whole_numbers(row.get(name, "") for row in rows):
                for row in rows:
                    if row.get(name, ""):
                        row[name] = str(int(float(row[name])))
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
