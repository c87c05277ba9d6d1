"""FedAvg, FedProx and the server optimisers through ``fedsec.Federation`` on non-IID digits.

Digits, 10 clients, Dirichlet(alpha) label skew, logistic regression (softmax), E = 2 local epochs,
B = 16, local lr 0.1, no secure layer and no DP (the strategies act on the released aggregate, so
their accuracy under masking differs only by quantisation). Reports, per strategy, the test accuracy
after each of ``rounds`` rounds (final and best) and the seconds per round; FedAvg is the reference
measured in the same run.

    python -m benchmarks.strategies [--rounds 30] [--alpha 0.1] [--seed 0]

Last stdout line: {"settings": {...}, "fedavg": {"final_accuracy", "best_accuracy",
"seconds_per_round"}, "fedprox": {...}, "fedavgm": {...}, "fedadam": {...}, "fedyogi": {...}}.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import fedsec
from benchmarks._common import emit, log
from fedsec import fl_core

STRATEGIES = {
    "fedavg": {},
    "fedprox": {"algorithm": "fedprox", "prox_mu": 0.1},
    "fedavgm": {"server_optimizer": "momentum", "server_lr": 1.0, "server_momentum": 0.5},
    "fedadam": {"server_optimizer": "adam", "server_lr": 0.03},
    "fedyogi": {"server_optimizer": "yogi", "server_lr": 0.03},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    data = fl_core.load_federated("digits", n_clients=10, partition="dirichlet", alpha=args.alpha,
                                  rng=rng)
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=10, seed=args.seed)
    clients = [(c.x, c.y) for c in data.clients]
    result: dict = {"settings": {"dataset": "digits", "clients": 10, "partition": "dirichlet",
                                 "alpha": args.alpha, "model": "logreg", "local_epochs": 2,
                                 "batch_size": 16, "lr": 0.1, "rounds": args.rounds,
                                 "seed": args.seed}}
    for name, kwargs in STRATEGIES.items():
        start = time.perf_counter()
        run = fedsec.Federation(model=model, clients=clients, test=(data.test.x, data.test.y),
                                secure=None, rounds=args.rounds, local_epochs=2, batch_size=16,
                                lr=0.1, seed=args.seed, **kwargs).run()
        seconds = time.perf_counter() - start
        accuracies = [r["accuracy"] for r in run.history]
        result[name] = {"final_accuracy": round(accuracies[-1], 4),
                        "best_accuracy": round(max(accuracies), 4),
                        "seconds_per_round": round(seconds / len(accuracies), 4), **kwargs}
        log(f"{name:8s} final {accuracies[-1]:.4f} best {max(accuracies):.4f} "
            f"({seconds / len(accuracies):.3f} s/round)")
    emit(result)


if __name__ == "__main__":
    main()
