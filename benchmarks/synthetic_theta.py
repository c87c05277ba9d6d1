"""Does the federated estimate of theta approach the centralised one? Synthetic set-ups 1-4.

For each set-up, K = 5 clients share 5,000 samples with p = 10 correlated features. The
centralised reference is the maximum-likelihood logistic regression on the pooled raw training
data (Newton's method). The federation standardises features with global statistics computed
through the aggregation seam, trains ``logreg`` with FedAvg, and its estimate is mapped back to
raw feature units before comparing. Two FedAvg configurations:
``exact`` (E = 1, full local batch, lr 2.0: the same path as centralised gradient descent, so it
converges to the MLE) and ``practical`` (E = 2, B = 64, lr 0.1: local SGD, which stops at a
distance set by its gradient noise and, on non-IID set-ups, client drift).
Reported: (intercept, theta) relative distance ||fed - central|| / ||central|| at checkpoint
rounds, the central estimate's relative distance to the true parameters, and test accuracies.

    python -m benchmarks.synthetic_theta [--rounds 300] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from fedsec.fl_core.centralized import logistic_mle
from fedsec.fl_core.standardize import linear_in_raw_units

from benchmarks._common import emit, log
from fedsec import fl_core

CONFIGS = {
    "exact": {"epochs": 1, "batch_size": 0, "lr": 2.0},
    "practical": {"epochs": 2, "batch_size": 64, "lr": 0.1},
}


def raw_parameters(vector: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(intercept, theta...) in raw feature units from a binary logreg vector (weights, then bias)."""
    intercept, theta = linear_in_raw_units(vector[:-1], float(vector[-1]), mean, std)
    return np.concatenate([[intercept], theta])


class ThetaTracker(fl_core.RoundObserver):
    """Records the relative distance of the global estimate to a reference at checkpoint rounds."""

    def __init__(self, server: fl_core.FederatedServer, reference: np.ndarray, checkpoints: set[int]) -> None:
        self.server, self.reference, self.checkpoints = server, reference, checkpoints
        self.distances: dict[int, float] = {}

    def after_round(self, record: fl_core.RoundRecord) -> None:
        if record.round in self.checkpoints:
            info = self.server.data.info
            estimate = raw_parameters(fl_core.get_vector(self.server.model), info["feature_mean"],
                                      info["feature_std"])
            self.distances[record.round] = float(
                np.linalg.norm(estimate - self.reference) / np.linalg.norm(self.reference))


def run_setup(setup: int, rounds: int, seed: int) -> dict:
    data = fl_core.load_federated("synthetic", n_clients=5, synthetic_setup=setup,
                                  synthetic_samples=5000, synthetic_features=10,
                                  rng=np.random.default_rng(seed))
    pooled = data.pooled()
    b_c, theta_c = logistic_mle(pooled.x, pooled.y)
    reference = np.concatenate([[b_c], theta_c])
    truth = np.concatenate([[data.info["intercept"]], data.info["theta"]])
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=seed)
    z = data.test.x.astype(np.float64) @ theta_c + b_c
    out = {
        "client_sizes": [len(c) for c in data.clients],
        "central_vs_true_rel": round(float(np.linalg.norm(reference - truth) / np.linalg.norm(truth)), 4),
        "central_accuracy": round(float(((z > 0) == data.test.y).mean()), 4),
    }
    checkpoints = {r for r in (10, 30, 100, 300, 1000) if r <= rounds} | {rounds}
    initial = fl_core.get_vector(model)
    for name, cfg in CONFIGS.items():
        fl_core.set_vector(model, initial)
        server = fl_core.FederatedServer(
            model=model, data=data,
            strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(**cfg)),
            protocol=fl_core.PlainAggregation(), rounds=rounds,
            rng=np.random.default_rng(seed + 1))
        tracker = ThetaTracker(server, reference, checkpoints)
        server.observers.append(tracker)
        result = server.run()
        distances = {str(k): round(v, 5) for k, v in sorted(tracker.distances.items())}
        out[name] = {"rel_distance_by_round": distances,
                     "accuracy": round(result.final_accuracy, 4)}
        log(f"setup {setup} {name}: {out[name]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    emit({f"setup_{s}": run_setup(s, args.rounds, args.seed) for s in (1, 2, 3, 4)})


if __name__ == "__main__":
    main()
