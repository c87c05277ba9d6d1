"""Turn an :class:`ExperimentConfig` into a running federation and a run directory."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fl_core
from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.plots import plot_metric
from fedsec.privacy import PrivacySetup, build_privacy
from fedsec.progress import ProgressBar
from fl_core.history import HistoryRecorder, RoundObserver, TrainingResult

RUN_FILES = ("config.toml", "history.csv", "summary.json", "accuracy.png")


@dataclass
class Experiment:
    """Everything one run needs, built and validated, nothing run yet."""

    config: ExperimentConfig
    data: fl_core.FederatedDataset
    server: fl_core.FederatedServer
    history: HistoryRecorder
    privacy: PrivacySetup | None = None


def build_experiment(
    config: ExperimentConfig, *, observers: list[RoundObserver] | None = None
) -> Experiment:
    """Load the data, build model, strategy and protocol, and wire the server loop.

    Raises:
        ConfigError: a combination of keys that only shows up when the data are loaded.
    """
    rng = np.random.default_rng(config.seed)
    d, t = config.data, config.train
    try:
        data = fl_core.load_federated(
            d.dataset,
            n_clients=d.clients,
            partition=d.partition,
            test_fraction=d.test_fraction,
            rng=rng,
            alpha=d.alpha,
            shards_per_client=d.shards_per_client,
            synthetic_setup=d.setup,
            synthetic_samples=d.samples,
            synthetic_features=d.features,
        )
    except fl_core.InvalidParameterError as error:
        raise ConfigError("data", str(error)) from None
    if not d.standardize:
        data = dataclasses.replace(data, standardize=False)
    model = fl_core.build_model(
        config.model.name,
        input_shape=data.input_shape,
        n_classes=data.n_classes,
        seed=int(rng.integers(0, 2**63 - 1)),
    )
    protocol = build_protocol(config, data, rng)
    n_parameters = sum(p.numel() for p in model.parameters())
    privacy = build_privacy(config, data, protocol, n_parameters)
    trainer: fl_core.LocalTrainer = fl_core.SGDTrainer(epochs=t.local_epochs,
                                                       batch_size=t.batch_size, lr=t.lr)
    if privacy is not None:
        trainer = privacy.trainer or trainer
        protocol = privacy.protocol or protocol
    if t.algorithm == "fedavg":
        strategy: fl_core.Strategy = fl_core.FedAvg(trainer=trainer)
    else:
        strategy = fl_core.FedSGD(lr=t.lr)
    history = HistoryRecorder()
    extra = [privacy.budget] if privacy is not None else []
    server = fl_core.FederatedServer(
        model=model,
        data=data,
        strategy=strategy,
        protocol=protocol,
        rounds=config.rounds,
        fraction=t.fraction,
        rng=rng,
        target_accuracy=t.target_accuracy or None,
        stop_tol=t.stop_tol,
        observers=[history, *extra, *(observers or [])],
    )
    return Experiment(config, data, server, history, privacy)


def build_protocol(
    config: ExperimentConfig, data: fl_core.FederatedDataset, rng: np.random.Generator
) -> fl_core.AggregationProtocol:
    """The aggregation protocol that ``secure.aggregation`` names."""
    s = config.secure
    if s.aggregation == "masking":
        from protocols.masked import MaskedAggregation

        return MaskedAggregation(
            max_weight=max(len(c) for c in data.clients), rng=rng, clip=s.clip, bits=s.bits,
            graph=s.graph, threshold=s.threshold, dropout=s.dropout, active=s.active,
            tolerated_corrupt=s.corrupt)
    if s.aggregation == "paillier":
        from protocols.paillier import PaillierAggregation, default_threshold

        m = fl_core.clients_per_round(config.train.fraction, data.n_clients)
        return PaillierAggregation(
            max_weight=max(len(c) for c in data.clients), rng=rng, clip=s.clip, bits=s.bits,
            threshold=s.threshold or default_threshold(m), dropout=s.dropout,
            key_bits=s.key_bits, custody=s.custody, parties=range(data.n_clients))
    return fl_core.PlainAggregation()


class _RunDirectoryWriter(RoundObserver):
    """Rewrites ``history.csv`` after every round, so a crashed run keeps what it did."""

    def __init__(self, out: Path, history: HistoryRecorder) -> None:
        self.out, self.history = out, history

    def after_round(self, record: fl_core.RoundRecord) -> None:
        self.history.write_csv(self.out / "history.csv")


def versions() -> dict[str, str]:
    """Versions of fedsec and the libraries that decide a run's numbers."""
    import sklearn
    import torch

    from fedsec import __version__

    return {
        "fedsec": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "scikit-learn": sklearn.__version__,
    }


def summarize(
    config: ExperimentConfig, result: TrainingResult, wall_seconds: float, setup_upload: int,
    privacy: PrivacySetup | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` content of a finished run."""
    last = result.records[-1].metrics if result.records else {}
    extra: dict[str, Any] = {}
    if privacy is not None:
        budget = privacy.budget
        extra = {"privacy": {
            "unit": privacy.unit, "accountant": config.dp.accountant,
            "noise_multiplier": privacy.noise_multiplier, "epsilon": budget.spent,
            "epsilon_rdp": last.get("epsilon_rdp"), "delta": config.dp.delta,
            "target_epsilon": config.dp.target_epsilon or None,
            "budget_remaining": last.get("budget_remaining"),
            "stopped": budget.stopped,
            "not_covered": privacy.not_covered,
            "ledger": budget.state_dict(),
        }}
    return {
        "final_accuracy": result.final_accuracy,
        "best_accuracy": result.best_accuracy,
        "rounds_run": result.rounds_run,
        "rounds_to_target": result.rounds_to_target,
        "epsilon": last.get("epsilon"),
        "delta": last.get("delta"),
        "wall_seconds": round(wall_seconds, 3),
        "config_sha256": config.sha256(),
        "versions": versions(),
        "stop_reason": result.stop_reason,
        "setup_upload_bytes": setup_upload,
        **extra,
    }


def run_experiment(
    config: ExperimentConfig, *, out: str | Path | None = None, progress: bool = False
) -> dict[str, Any]:
    """Run one experiment; with ``out``, write the run directory. Returns the summary dict.

    All validation (including loading the data) happens before ``out`` is created.
    """
    import torch

    # The bundled models are tiny: one intra-op thread is faster than several on a CPU.
    torch.set_num_threads(1)
    observers: list[RoundObserver] = []
    if progress:
        observers.append(ProgressBar(target_accuracy=config.train.target_accuracy or None))
    experiment = build_experiment(config, observers=observers)
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.toml").write_text(config.to_toml())
        experiment.server.observers.append(_RunDirectoryWriter(out_dir, experiment.history))
    start = time.perf_counter()
    result = experiment.server.run()
    wall = time.perf_counter() - start
    summary = summarize(config, result, wall, experiment.server.setup_upload_bytes,
                        experiment.privacy)
    if out_dir is not None:
        experiment.history.write_csv(out_dir / "history.csv")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_metric(
            result.records,
            metric="accuracy",
            path=out_dir / "accuracy.png",
            title=f"{config.data.dataset}, {config.data.clients} clients ({config.data.partition}), "
            f"{config.model.name}, {config.train.algorithm}",
            ylabel="test accuracy",
            target=config.train.target_accuracy or None,
        )
        if any("epsilon" in r.metrics for r in result.records):
            plot_metric(result.records, metric="epsilon", path=out_dir / "epsilon.png",
                        title="privacy spent", ylabel="epsilon")
    return summary
