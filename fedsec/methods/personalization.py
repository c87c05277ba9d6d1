"""``train.algorithm = "ditto" | "perfedavg"``: personalised models and their per-client report.

Each client's data are split into a local training part (what it trains on) and a held-out local
test part (``personal.holdout``, stratified, seeded). After the run, every client's accuracy on its
own held-out part is measured twice: with the global model (``global``: for Ditto exactly the FedAvg
model of the same run) and with its personalised model (``personal``: Ditto's v_k, or the global
model after ``personal.adapt_steps`` Per-FedAvg adaptation steps on the client's training part).
These evaluations run on the clients; nothing personal crosses the seam.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.history import TrainingResult
from fedsec.fl_core.personalization import Ditto, PerFedAvg, adapt, per_client_accuracy, split_local

ALGORITHMS = ("ditto", "perfedavg")
ADAPT_STREAM = 16
"""Mixed into the seed for the generator of Per-FedAvg's evaluation-time adaptation batches."""


def split(config: ExperimentConfig, data: fl_core.FederatedDataset, rng: np.random.Generator
          ) -> tuple[fl_core.FederatedDataset, tuple[ArrayDataset, ...]]:
    """The clients' local training parts and their held-out local test sets."""
    return split_local(data, holdout=config.personal.holdout, rng=rng)


def build_strategy(config: ExperimentConfig, trainer: fl_core.LocalTrainer, *,
                   weighting: str) -> fl_core.Strategy:
    """Ditto around FedAvg with ``trainer`` (DP-SGD's when private), or Per-FedAvg."""
    t, p = config.train, config.personal
    if t.algorithm == "perfedavg":
        return PerFedAvg(alpha=p.lr, beta=t.lr, local_steps=p.steps, batch_size=t.batch_size,
                         weighting=weighting)
    optimizer = (None if t.server_optimizer == "sgd" and not t.server_lr else
                 fl_core.make_server_optimizer(t.server_optimizer, lr=t.server_lr or None))
    inner = fl_core.FedAvg(trainer=trainer, server_optimizer=optimizer, weighting=weighting)
    return Ditto(inner=inner, lam=p.lam, lr=p.lr, epochs=p.epochs, batch_size=t.batch_size)


def _scaled(part: ArrayDataset, info: dict[str, Any]) -> ArrayDataset:
    if "feature_mean" not in info:
        return part
    flat = part.x.reshape(len(part), -1)
    x = ((flat - info["feature_mean"]) / info["feature_std"]).astype(np.float32)
    return ArrayDataset(x.reshape(part.x.shape), part.y)


def personal_vectors(config: ExperimentConfig, server: fl_core.FederatedServer,
                     vector: np.ndarray) -> list[np.ndarray]:
    """Every client's personalised model (the global one for a Ditto client that never took part)."""
    strategy = server.strategy
    strategy = getattr(strategy, "inner", strategy) if not isinstance(strategy, Ditto) else strategy
    if isinstance(strategy, Ditto):
        found = [strategy.personal_vector(c) for c in server.data.clients]
        return [vector if v is None else v for v in found]
    p, t = config.personal, config.train
    return [adapt(server.model, vector, c, alpha=p.lr, steps=p.adapt_steps, batch_size=t.batch_size,
                  rng=np.random.default_rng([config.seed, ADAPT_STREAM, k]))
            for k, c in enumerate(server.data.clients)]


def report(config: ExperimentConfig, server: fl_core.FederatedServer, tests: tuple[ArrayDataset, ...],
           result: TrainingResult, out_dir: Path | None) -> dict[str, Any]:
    """The ``personalization`` entry of summary.json (and ``personalization.png`` in ``out_dir``)."""
    tests = tuple(_scaled(t, server.data.info) for t in tests)
    k = len(tests)
    before = per_client_accuracy(server.model, [result.vector] * k, tests)
    after = per_client_accuracy(server.model, personal_vectors(config, server, result.vector), tests)
    fl_core.set_vector(server.model, result.vector)
    entry = {
        "algorithm": config.train.algorithm,
        "global_accuracy": [round(float(a), 6) for a in before],
        "personal_accuracy": [round(float(a), 6) for a in after],
        "mean_global_accuracy": float(before.mean()),
        "mean_personal_accuracy": float(after.mean()),
        "local_test_sizes": [len(t) for t in tests],
    }
    if config.train.algorithm == "ditto":
        entry["lam"] = config.personal.lam
    if out_dir is not None:
        _plot(entry, out_dir / "personalization.png",
              title=f"{config.data.dataset}, {k} clients ({config.data.partition}), "
                    f"{config.train.algorithm}"
                    + (f", lambda = {config.personal.lam:g}" if "lam" in entry else ""))
    return {"personalization": entry}


def _plot(entry: dict[str, Any], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = entry["global_accuracy"], entry["personal_accuracy"]
    index = np.arange(len(before))
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=100)
    ax.bar(index - 0.2, before, width=0.4, label="global model")
    ax.bar(index + 0.2, after, width=0.4, label="personalised")
    ax.set_xlabel("client")
    ax.set_ylabel("accuracy on the client's held-out data")
    ax.set_xticks(index)
    ax.set_ylim(0, 1.18)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, metadata={"Title": title})
    plt.close(fig)
