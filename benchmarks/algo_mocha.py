"""MOCHA against one global FedAvg model and local-only models: mean per-client test accuracy.

Two non-IID federations, each client holding out 25% of its own training samples as its test set
(a personal model is judged on its client's distribution; the global model on the same samples):
- synthetic set-up 4 (10 clients, 2,000 samples, 10 features; client-specific means and
  parameters, log-normal sizes);
- breast cancer with the ``feature_bias`` partition (5 clients, each a region of feature space).
Methods, all on the same standardised training splits:
- ``fedavg``: fl_core's FedAvg server, ``logreg``, E = 1, B = 16, lr 0.1, plain aggregation,
  40 rounds: one global logistic model;
- ``local``: each client alone (MOCHA with Sigma fixed at I/m: the tasks decouple exactly);
- ``mocha``: MOCHA, Sigma updated every 5 rounds, 40 rounds of H = 100 SDCA steps;
- ``mocha_stragglers``: the same with straggle = 0.5 (half the clients a round do a random
  number of steps in [0, H), 0 = skip).
All linear models use the logistic loss with lambda = 1e-3. Means over seeds (3; 1 with --quick).

    python -m benchmarks.algo_mocha [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
from fedsec.fl_core.mocha import Mocha, MochaClient
from fedsec.fl_core.models import evaluate
from fedsec.fl_core.standardize import apply_standardization, federated_moments

from benchmarks._common import emit, log
from fedsec import fl_core
from fedsec.methods.mocha import holdout_split

ROUNDS = 40
LAM = 1e-3
HOLDOUT = 0.25
TASKS = {
    "synthetic_setup4": {"name": "synthetic", "n_clients": 10, "synthetic_setup": 4,
                         "synthetic_samples": 2000, "synthetic_features": 10},
    "breast_cancer_feature_bias": {"name": "breast_cancer", "n_clients": 5, "partition": "feature_bias"},
}


def _splits(task: dict[str, Any], seed: int):
    rng = np.random.default_rng(seed)
    spec = dict(task)
    data = fl_core.load_federated(spec.pop("name"), rng=rng, **spec)
    mean, std, _ = federated_moments(data, fl_core.PlainAggregation())
    data = apply_standardization(data, mean, std)
    return data, [holdout_split(c, HOLDOUT, rng) for c in data.clients]


def _mocha(splits, seed: int, *, omega_every: int, straggle: float = 0.0) -> list[float]:
    clients = [MochaClient(client_id=t, x=tr.x, y=tr.y) for t, (tr, _) in enumerate(splits)]
    result = Mocha(loss="logistic", lam=LAM, local_steps=100, omega_every=omega_every,
                   straggle=straggle).fit(clients, rounds=ROUNDS, rng=np.random.default_rng(seed))
    return [c.accuracy(result.w[:, t], te.x, te.y) for t, (c, (_, te)) in enumerate(zip(clients, splits))]


def _fedavg(data: fl_core.FederatedDataset, splits, seed: int) -> list[float]:
    federation = fl_core.FederatedDataset(
        name=data.name, clients=tuple(tr for tr, _ in splits), test=data.test, n_classes=2,
        input_shape=data.input_shape, standardize=False)
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=seed)
    server = fl_core.FederatedServer(
        model=model, data=federation, protocol=fl_core.PlainAggregation(), rounds=ROUNDS,
        strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=16, lr=0.1)),
        rng=np.random.default_rng(seed))
    server.run()
    return [evaluate(server.model, te.x, te.y)[0] for _, te in splits]


def run(quick: bool = False) -> dict[str, Any]:
    """Mean per-client accuracy of FedAvg, local-only and MOCHA on the two non-IID federations."""
    torch.set_num_threads(1)
    seeds = [0] if quick else [0, 1, 2]
    out: dict[str, Any] = {"rounds": ROUNDS, "lambda": LAM, "holdout": HOLDOUT, "seeds": seeds}
    for label, task in TASKS.items():
        scores: dict[str, list[float]] = {"fedavg": [], "local": [], "mocha": [], "mocha_stragglers": []}
        worst: dict[str, list[float]] = {k: [] for k in scores}
        for seed in seeds:
            data, splits = _splits(task, seed)
            per_client = {"fedavg": _fedavg(data, splits, seed),
                          "local": _mocha(splits, seed, omega_every=0),
                          "mocha": _mocha(splits, seed, omega_every=5),
                          "mocha_stragglers": _mocha(splits, seed, omega_every=5, straggle=0.5)}
            for key, values in per_client.items():
                scores[key].append(float(np.mean(values)))
                worst[key].append(float(np.min(values)))
        entry = {key: round(float(np.mean(v)), 4) for key, v in scores.items()}
        entry["worst_client"] = {key: round(float(np.mean(v)), 4) for key, v in worst.items()}
        log(f"{label}: {entry}")
        out[label] = entry
    return {"mocha": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed")
    emit(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
