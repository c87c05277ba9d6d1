"""``train.algorithm = "mocha"``: MOCHA multi-task learning, plain communication only.

Each client holds out ``mocha.holdout`` of its own training samples as its test set (a personal model
is judged on its own distribution); the run's accuracy is the mean of the per-client accuracies.
The server sees every client's Delta v_t and hence every model: the configuration refuses any secure
layer and DP (fedsec.config), because Sigma's update needs the individual models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsec.config import ExperimentConfig
from fedsec.fl_core import ArrayDataset, PlainAggregation
from fedsec.fl_core.history import RoundRecord
from fedsec.fl_core.mocha import Mocha, MochaClient, MochaRound
from fedsec.fl_core.standardize import apply_standardization, federated_moments
from fedsec.methods.linear import RoundLog, load_data, run_linear


def holdout_split(part: ArrayDataset, fraction: float, rng: np.random.Generator
                  ) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test) of one client: a random ``fraction`` held out, at least one sample each side."""
    n = len(part)
    if n < 2:
        raise ValueError(f"mocha.holdout needs >= 2 samples per client; a client holds {n}")
    order = rng.permutation(n)
    k = min(max(int(round(fraction * n)), 1), n - 1)
    return part.subset(np.sort(order[k:])), part.subset(np.sort(order[:k]))


def run_mocha(config: ExperimentConfig, *, out: str | Path | None = None, progress: bool = False,
              force: bool = False) -> dict[str, Any]:
    """Run MOCHA as ``config`` says; returns the summary (with a ``mocha`` section)."""
    rng = np.random.default_rng(config.seed)
    data = load_data(config, rng)
    c = config.mocha
    solver = Mocha(loss=c.loss, lam=c.lam, local_steps=c.local_steps, omega_every=c.omega_every,
                   straggle=c.straggle)
    state: dict[str, Any] = {}

    def train(log: RoundLog):
        nonlocal data
        setup = 0
        if data.standardize:
            mean, std, setup = federated_moments(data, PlainAggregation())
            data = apply_standardization(data, mean, std)
        splits = [holdout_split(part, c.holdout, rng) for part in data.clients]
        clients = [MochaClient(client_id=t, x=tr.x, y=tr.y) for t, (tr, _) in enumerate(splits)]
        d = clients[0].x.shape[1]
        previous = {"w": np.zeros((d, len(clients)))}

        def on_round(r: MochaRound, w: np.ndarray) -> None:
            accuracies = [cl.accuracy(w[:, t], te.x, te.y) for t, (cl, (_, te)) in
                          enumerate(zip(clients, splits, strict=True))]
            state["accuracies"] = accuracies
            log.add(RoundRecord(
                round=r.round, accuracy=float(np.mean(accuracies)), loss=float("nan"),
                train_loss=float("nan"), participants=len(clients) - r.skipped, dropped=r.skipped,
                upload_bytes=8 * d * (len(clients) - r.skipped), seconds=0.0,
                update_norm=float(np.linalg.norm(w - previous["w"])),
                metrics={"gap": r.gap, "primal": r.primal, "dual": r.dual, "local_steps": r.steps,
                         "min_client_accuracy": float(np.min(accuracies))}))
            previous["w"] = w

        result = solver.fit(clients, rounds=config.rounds, rng=rng, on_round=on_round)
        state["w"], state["sigma"] = result.w, result.sigma
        section = {
            "loss": c.loss, "lam": c.lam, "local_steps": c.local_steps, "omega_every": c.omega_every,
            "straggle": c.straggle, "holdout": c.holdout, "final_gap": result.rounds[-1].gap,
            "per_client_accuracy": state["accuracies"], "sigma": result.sigma.tolist(),
            "skipped_updates": sum(r.skipped for r in result.rounds),
            "accuracy_meaning": "mean per-client accuracy (each client's held-out samples)",
            "released_per_round": "every client's Delta v_t, hence every client's model (plain only)",
        }
        return log.finish(result.w.ravel().astype(np.float32)), section, setup

    def save(path: Path) -> None:
        import torch
        from matplotlib import pyplot

        torch.save({"W": torch.tensor(state["w"]), "sigma": torch.tensor(state["sigma"])},
                   path / "model.pt")
        figure, ax = pyplot.subplots(figsize=(5, 4.2), dpi=100)
        image = ax.imshow(state["sigma"], cmap="viridis")
        figure.colorbar(image, ax=ax)
        ax.set_title("MOCHA task covariance Sigma (trace 1)", fontsize=9)
        ax.set_xlabel("client")
        ax.set_ylabel("client")
        figure.tight_layout()
        figure.savefig(path / "task_relationship.png")
        pyplot.close(figure)

    return run_linear(config, train, save, out=out, progress=progress, force=force)
