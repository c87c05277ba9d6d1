"""``train.algorithm = "boosting"``: federated component-wise boosting as a ``fedsec run``.

The run directory keeps its contract (config.toml, history.csv with one row per boosting
iteration, summary.json, model.pt, accuracy.png) and adds ``coefficients.png`` (coefficient paths
and fitted partial effects) and a ``boosting`` entry in summary.json (selected learners, in the
order first selected, with counts, and the final linear slopes).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.fl_core.boosting import (
    BoostingFit,
    BoostingModel,
    BoostingSpec,
    BoostingStep,
    FederatedBoosting,
    family_named,
)
from fedsec.fl_core.history import HistoryRecorder, RoundObserver, RoundRecord, TrainingResult
from fedsec.fl_core.standardize import apply_standardization, federated_moments
from fedsec.methods.boosting_plots import plot_coefficient_paths
from fedsec.plots import plot_metric


def boosting_spec(config: ExperimentConfig) -> BoostingSpec:
    """The public model description of the ``[boosting]`` keys."""
    b = config.boosting
    return BoostingSpec(family=b.family, learners=b.learners, nu=b.nu, df=b.df,
                        inner_knots=b.knots, degree=b.degree, difference=b.difference,
                        spline_range=b.spline_range)


@dataclass
class BoostingRun:
    """A validated boosting experiment, data loaded, nothing run yet."""

    config: ExperimentConfig
    data: fl_core.FederatedDataset
    protocol: fl_core.AggregationProtocol
    spec: BoostingSpec


def prepare_boosting(config: ExperimentConfig) -> BoostingRun:
    """Load the data and build the protocol (ConfigError for what shows only with the data)."""
    from fedsec.experiment import build_protocol
    from fedsec.methods.linear import load_data

    rng = np.random.default_rng(config.seed)
    d = config.data
    data = load_data(config, rng)
    if data.n_classes != 2:
        raise ConfigError("data.dataset", f"boosting fits binary labels; {d.dataset} has "
                                          f"{data.n_classes} classes")
    return BoostingRun(config, data, build_protocol(config, data, rng), boosting_spec(config))


class _Recorder:
    """Turns every boosting step into a history row (test accuracy and loss after the step)."""

    def __init__(self, run: BoostingRun, observers: list[RoundObserver]) -> None:
        self.test, self.observers = run.data.test, observers
        self.family = family_named(run.spec.family)
        self.nu, self.n_clients = run.spec.nu, run.data.n_clients
        self.target = run.config.train.target_accuracy or None
        self.records: list[RoundRecord] = []
        self.reached: int | None = None
        self.y = self.test.y.astype(np.float64)

    def __call__(self, step: BoostingStep, model: BoostingModel) -> bool:
        f = model.decision_function(self.test.x)
        accuracy = float(np.mean((self.family.probability(f) >= 0.5) == (self.y == 1)))
        beta = model.coefficients[step.selected]
        record = RoundRecord(
            round=step.iteration, accuracy=accuracy, loss=float(self.family.loss(self.y, f).mean()),
            train_loss=step.train_loss, participants=self.n_clients, dropped=0,
            upload_bytes=step.upload_bytes, seconds=step.seconds,
            update_norm=float(self.nu * np.linalg.norm(beta)) if beta.size else 0.0,
            metrics={"selected": step.learner, "rss_reduction": step.rss_reduction})
        self.records.append(record)
        for observer in self.observers:
            observer.after_round(record)
        if self.target is not None and accuracy >= self.target:
            self.reached = step.iteration
            return True
        return False


def boosting_summary(fit: BoostingFit) -> dict[str, Any]:
    """The ``boosting`` entry of summary.json."""
    order: list[str] = []
    for step in fit.steps:
        if step.learner not in order:
            order.append(step.learner)
    counts = fit.selection_counts()
    return {
        "selected": [{"learner": name, "iterations": counts[name]} for name in order],
        "linear_slopes": {f"x{j}": v for j, v in fit.model.linear_slopes().items() if v},
        "offset": fit.model.offset,
        "setup_upload_bytes": fit.setup_upload_bytes,
    }


def run_boosting(run: BoostingRun, out_dir: Path | None, *,
                 observers: list[RoundObserver] | None = None) -> dict[str, Any]:
    """Standardise (federated), boost ``rounds`` iterations, and write the run directory."""
    import torch

    from fedsec.experiment import summarize

    config, data = run.config, run.data
    if out_dir is not None:
        (out_dir / "config.toml").write_text(config.to_toml())
    history = HistoryRecorder()
    watchers = [history, *(observers or [])]
    for observer in watchers:
        observer.on_start(n_clients=data.n_clients, clients_per_round=data.n_clients,
                          rounds=config.rounds)
    start = time.perf_counter()
    setup_upload = 0
    if data.standardize:
        mean, std, setup_upload = federated_moments(data, run.protocol)
        data = apply_standardization(data, mean, std)
    recorder = _Recorder(BoostingRun(config, data, run.protocol, run.spec), watchers)
    fit = FederatedBoosting(spec=run.spec, protocol=run.protocol,
                            iterations=config.rounds).fit(data.clients, callback=recorder)
    wall = time.perf_counter() - start
    result = TrainingResult(fit.model.flat_coefficients(), recorder.records, recorder.reached,
                            "target_accuracy" if recorder.reached else "rounds")
    for observer in watchers:
        observer.on_finish(result)
    summary = summarize(config, result, wall, setup_upload + fit.setup_upload_bytes)
    summary["warnings"] = []
    summary["boosting"] = boosting_summary(fit)
    if out_dir is None:
        return summary
    history.write_csv(out_dir / "history.csv")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    state = {"offset": torch.tensor([fit.model.offset], dtype=torch.float64)}
    state.update({learner.name: torch.from_numpy(beta.copy())
                  for learner, beta in zip(fit.model.learners, fit.model.coefficients, strict=True)})
    torch.save(state, out_dir / "model.pt")
    d, b = config.data, config.boosting
    title = (f"{d.dataset}, {d.clients} clients ({d.partition}), boosting ({b.family}, {b.learners}, "
             f"nu = {b.nu:g}), secure.aggregation = {config.secure.aggregation}")
    plot_metric(result.records, metric="accuracy", path=out_dir / "accuracy.png", title=title,
                ylabel="test accuracy", target=config.train.target_accuracy or None)
    plot_coefficient_paths(fit, path=out_dir / "coefficients.png", title=title)
    return summary
