"""A per-round progress bar (tqdm) showing accuracy and, when a privacy layer reports it, epsilon."""

from __future__ import annotations

import sys

from tqdm import tqdm

from fedsec.fl_core.history import RoundObserver, RoundRecord, TrainingResult


class ProgressBar(RoundObserver):
    """Prints one bar on stderr that advances by one each round."""

    def __init__(self, *, target_accuracy: float | None = None) -> None:
        self.target_accuracy = target_accuracy
        self.bar: tqdm | None = None

    def on_start(self, *, n_clients: int, clients_per_round: int, rounds: int) -> None:
        self.bar = tqdm(total=rounds, desc="rounds", unit="round", file=sys.stderr,
                        dynamic_ncols=True, leave=True)

    def after_round(self, record: RoundRecord) -> None:
        if self.bar is None:
            return
        postfix = {"acc": f"{record.accuracy:.4f}"}
        if "epsilon" in record.metrics:
            postfix["eps"] = f"{record.metrics['epsilon']:.3f}"
        if record.status != "ok":
            postfix["status"] = "aborted"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def on_finish(self, result: TrainingResult) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
