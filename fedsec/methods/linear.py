"""What CoCoA and MOCHA runs share: loading the data, the run directory, the plots, the summary.

Both train binary linear models on flattened features with an appended intercept; neither builds a
torch training loop. A run writes the contract files (config.toml, history.csv, summary.json,
model.pt, accuracy.png) plus ``duality_gap.png``; MOCHA adds ``task_relationship.png``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.fl_core.history import HistoryRecorder, RoundObserver, RoundRecord, TrainingResult
from fedsec.plots import metric_figure, plot_metric
from fedsec.progress import ProgressBar
from fedsec.rundir import RunDirectory, check_out


def load_data(config: ExperimentConfig, rng: np.random.Generator) -> fl_core.FederatedDataset:
    """The federation ``config.data`` describes (not yet standardised)."""
    d = config.data
    try:
        data = fl_core.load_federated(
            d.dataset, n_clients=d.clients, partition=d.partition, test_fraction=d.test_fraction,
            rng=rng, alpha=d.alpha, shards_per_client=d.shards_per_client, synthetic_setup=d.setup,
            synthetic_samples=d.samples, synthetic_features=d.features)
    except fl_core.InvalidParameterError as error:
        raise ConfigError("data", str(error)) from None
    return data if d.standardize else dataclasses.replace(data, standardize=False)


class RoundLog:
    """Turns a method's rounds into :class:`RoundRecord` rows, timing each round."""

    def __init__(self, observers: list[RoundObserver], rounds: int, n_clients: int,
                 clients_per_round: int) -> None:
        self.history = HistoryRecorder()
        self.observers = [self.history, *observers]
        for observer in self.observers:
            observer.on_start(n_clients=n_clients, clients_per_round=clients_per_round, rounds=rounds)
        self.clock = time.perf_counter()

    def add(self, record: RoundRecord) -> None:
        now = time.perf_counter()
        record.seconds, self.clock = now - self.clock, now
        for observer in self.observers:
            observer.after_round(record)

    def finish(self, vector: np.ndarray) -> TrainingResult:
        result = TrainingResult(vector, self.history.records, None, "rounds")
        for observer in self.observers:
            observer.on_finish(result)
        return result


def run_linear(
    config: ExperimentConfig, train: Callable[[RoundLog], tuple[TrainingResult, dict[str, Any], int]],
    save: Callable[[Path], None], *, out: str | Path | None, progress: bool, force: bool,
) -> dict[str, Any]:
    """Validate ``out``, run ``train`` (returns the result, the method's summary section and the
    set-up upload bytes), then write the run directory with ``save(out_dir)`` for model and extras."""
    if out is not None:
        check_out(out, force=force)
    observers: list[RoundObserver] = [ProgressBar()] if progress else []
    if out is None:
        return _train(config, train, observers, None, save)
    staging = RunDirectory(out, force=force)
    try:
        return _train(config, train, observers, staging.path, save)
    finally:
        staging.publish()


def _train(config: ExperimentConfig,
           train: Callable[[RoundLog], tuple[TrainingResult, dict[str, Any], int]],
           observers: list[RoundObserver], path: Path | None, save: Callable[[Path], None]
           ) -> dict[str, Any]:
    from fedsec.experiment import summarize

    start = time.perf_counter()
    log = RoundLog(observers, config.rounds, config.data.clients,
                   fl_core.clients_per_round(config.train.fraction, config.data.clients))
    if path is not None:
        (path / "config.toml").write_text(config.to_toml())
    try:
        result, section, setup_upload = train(log)
    finally:
        if path is not None:
            log.history.write_csv(path / "history.csv")
    summary = summarize(config, result, time.perf_counter() - start, setup_upload)
    summary[config.train.algorithm] = section
    summary["warnings"] = []
    if path is None:
        return summary
    (path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    save(path)
    d = config.data
    title = (f"{d.dataset}, {d.clients} clients ({d.partition}), {config.train.algorithm} "
             f"({section['loss']}, lambda {section['lam']:g}), secure.aggregation = "
             f"{config.secure.aggregation!r}")
    plot_metric(result.records, metric="accuracy", path=path / "accuracy.png", title=title,
                ylabel=section["accuracy_meaning"])
    figure = metric_figure(result.records, metric="gap", title=title,
                           ylabel="duality gap P(w) - D(alpha)")
    figure.axes[0].set_yscale("log")
    figure.savefig(path / "duality_gap.png", metadata={"Title": title})
    from matplotlib import pyplot

    pyplot.close(figure)
    return summary
