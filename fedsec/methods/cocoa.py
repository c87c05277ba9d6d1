"""``train.algorithm = "cocoa"``: CoCoA / CoCoA+ through the configured aggregation layer.

The server learns, per round, the sum of the clients' Delta w (as FedAvg's sum of updates) and the
two federation-wide means of the gap terms; with masking or Paillier nothing else. Features are
standardised with federation-wide moments through the same layer first (as FedAvg runs do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.fl_core.cocoa import CoCoA, CoCoAClient, CoCoARound
from fedsec.fl_core.duality import make_loss, signed_labels, with_intercept
from fedsec.fl_core.history import RoundRecord
from fedsec.fl_core.standardize import apply_standardization, federated_moments
from fedsec.methods.linear import RoundLog, load_data, run_linear


def run_cocoa(config: ExperimentConfig, *, out: str | Path | None = None, progress: bool = False,
              force: bool = False) -> dict[str, Any]:
    """Run CoCoA as ``config`` says; returns the summary (with a ``cocoa`` section)."""
    from fedsec.experiment import build_protocol

    rng = np.random.default_rng(config.seed)
    data = load_data(config, rng)
    protocol = build_protocol(config, data, rng)
    c = config.cocoa
    solver = CoCoA(loss=c.loss, lam=c.lam, local_steps=c.local_steps, combine=c.combine)
    state: dict[str, Any] = {}
    # the clients' coordinate draws and client sampling have their own stream, so a run through a
    # secure layer (whose set-up draws from ``rng``) takes the same steps as the plain run
    steps_rng = np.random.default_rng((config.seed, 1))

    def train(log: RoundLog):
        nonlocal data
        setup = 0
        if data.standardize:
            mean, std, setup = federated_moments(data, protocol)
            data = apply_standardization(data, mean, std)
        clients = [CoCoAClient(client_id=k, x=part.x, y=part.y) for k, part in enumerate(data.clients)]
        test_x, test_y = with_intercept(data.test.x), signed_labels(data.test.y)
        m = fl_core.clients_per_round(config.train.fraction, len(clients))
        previous = {"w": np.zeros(test_x.shape[1])}

        def select(_: int) -> list[int]:
            return sorted(steps_rng.choice(len(clients), size=m, replace=False).tolist())

        def on_round(r: CoCoARound, w: np.ndarray) -> None:
            z = test_y * (test_x @ w)
            log.add(RoundRecord(
                round=r.round, accuracy=float(np.mean(z > 0)), loss=float(make_loss(c.loss).primal(z).mean()),
                train_loss=float("nan"), participants=r.participants, dropped=r.dropped,
                upload_bytes=r.upload_bytes, seconds=0.0,
                update_norm=float(np.linalg.norm(w - previous["w"])), status=r.status,
                metrics={"gap": r.gap, "primal": r.primal, "dual": r.dual}))
            previous["w"] = w

        result = solver.fit(clients, protocol, rounds=config.rounds, rng=steps_rng, select=select,
                            on_round=on_round)
        state["w"] = result.w
        gamma, sigma_prime = solver.aggregation_parameters(m)
        section = {
            "loss": c.loss, "lam": c.lam, "local_steps": c.local_steps, "combine": c.combine,
            "gamma": gamma, "sigma_prime": sigma_prime,
            "final_gap": result.rounds[-1].gap, "final_primal": result.rounds[-1].primal,
            "intercept": result.intercept, "weights": result.weights.tolist(),
            "accuracy_meaning": "test accuracy (global test split)",
            "released_per_round": "sum of Delta w; mean primal loss and mean dual term (2 numbers)",
        }
        return log.finish(result.w.astype(np.float32)), section, setup

    def save(path: Path) -> None:
        import torch

        w = state["w"]
        torch.save({"linear.weight": torch.tensor(w[None, :-1], dtype=torch.float32),
                    "linear.bias": torch.tensor(w[-1:], dtype=torch.float32)}, path / "model.pt")

    return run_linear(config, train, save, out=out, progress=progress, force=force)
