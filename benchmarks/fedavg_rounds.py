"""Rounds to reach a test accuracy with FedAvg versus FedSGD (McMahan et al. 2017, Table 2 style).

Digits CNN, 20 clients, C = 0.5 (10 clients a round), 0.90 target test accuracy. FedAvg runs
E = 5 local epochs with B = 10; FedSGD sends one full-batch gradient per client. Each algorithm's
learning rate is tuned over a grid: the reported rounds are the fewest any grid value needed
(null when none reached the target within the cap ``max_rounds``). Partitions: ``iid``, and
``shards`` with two shards (so about two labels) per client, McMahan's pathological non-IID split.

    python -m benchmarks.fedavg_rounds [--cap 500] [--seed 0]

Last stdout line: {"iid": {"fedavg_rounds", "fedsgd_rounds", "max_rounds", "speedup", ...},
"shards": {...}}.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks._common import emit, log
from fedsec import fl_core

FEDAVG_LRS = (0.05, 0.1, 0.2, 0.4, 0.8)
FEDSGD_LRS = (0.2, 0.35, 0.5, 0.8)


def rounds_to_target(
    *, partition: str, algorithm: str, lr: float, cap: int, seed: int, target: float, fraction: float
) -> int | None:
    """Rounds one run needs to reach ``target`` test accuracy, or None within ``cap`` rounds."""
    rng = np.random.default_rng(seed)
    data = fl_core.load_federated(
        "digits", n_clients=20, partition=partition, shards_per_client=2, rng=rng
    )
    model = fl_core.build_model("cnn", input_shape=data.input_shape, n_classes=10, seed=seed)
    if algorithm == "fedavg":
        strategy: fl_core.Strategy = fl_core.FedAvg(
            trainer=fl_core.SGDTrainer(epochs=5, batch_size=10, lr=lr)
        )
    else:
        strategy = fl_core.FedSGD(lr=lr)
    server = fl_core.FederatedServer(
        model=model,
        data=data,
        strategy=strategy,
        protocol=fl_core.PlainAggregation(),
        rounds=cap,
        fraction=fraction,
        rng=rng,
        target_accuracy=target,
    )
    return server.run().rounds_to_target


def tuned(
    partition: str, algorithm: str, lrs: tuple[float, ...], cap: int, **kw
) -> tuple[int | None, float | None]:
    """The fewest rounds any learning rate in ``lrs`` needed, and that rate (None, None if none did).

    Once some rate reached the target in R rounds, later rates run at most R rounds: a run that
    needs more cannot be the minimum, so the answer is the same as running each to ``cap``.
    """
    best: tuple[int | None, float | None] = (None, None)
    for lr in lrs:
        limit = best[0] or cap
        start = time.perf_counter()
        rounds = rounds_to_target(partition=partition, algorithm=algorithm, lr=lr, cap=limit, **kw)
        shown = rounds if rounds is not None else f"not within {limit}"
        log(f"{partition:7s} {algorithm:7s} lr={lr:<5g} rounds={shown} ({time.perf_counter() - start:.1f}s)")
        if rounds is not None and (best[0] is None or rounds < best[0]):
            best = (rounds, lr)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cap", type=int, default=500, help="round cap of every run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--fraction", type=float, default=0.5, help="C, share of clients a round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kw = {"seed": args.seed, "target": args.target, "fraction": args.fraction}
    result = {}
    for partition in ("iid", "shards"):
        fedavg, fedavg_lr = tuned(partition, "fedavg", FEDAVG_LRS, args.cap, **kw)
        fedsgd, fedsgd_lr = tuned(partition, "fedsgd", FEDSGD_LRS, args.cap, **kw)
        result[partition] = {
            "fedavg_rounds": fedavg,
            "fedsgd_rounds": fedsgd,
            "max_rounds": args.cap,
            "fedavg_lr": fedavg_lr,
            "fedsgd_lr": fedsgd_lr,
            "speedup": round(fedsgd / fedavg, 2) if fedavg and fedsgd else None,
        }
    result["setup"] = {"dataset": "digits", "model": "cnn", "clients": 20, "fraction": args.fraction,
                       "fedavg": {"E": 5, "B": 10}, "fedsgd": {"B": "full"}, "target": args.target,
                       "seed": args.seed}
    emit(result)


if __name__ == "__main__":
    main()
