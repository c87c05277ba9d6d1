"""Personalisation (Ditto over lambda, Per-FedAvg) against FedAvg on non-IID tasks.

Two tasks: the hospital task (breast cancer, 4 clients, Dirichlet(0.3) label skew) and digits (10
clients, 2 label shards each); logistic regression, E = 1, B = 16, lr 0.1, no DP, plain sums (a
Ditto run under masking is reported beside to show the secure layer changes nothing but
quantisation). Every client holds out 25 % of its data (stratified) as its local test set. For each
run: the mean over clients of the accuracy on their own held-out data, with the global model
(``global``: for Ditto exactly FedAvg's model) and with the personalised model (``personal``: Ditto's
v_k, or Per-FedAvg's global model after ``adapt_steps`` local steps). lambda = 0 is local training.

    python -m benchmarks.algo_personalization [--quick]

Last stdout line: {"settings": {...}, "<task>": {"fedavg": acc, "ditto": {"<lambda>": {"global",
"personal"}}, "ditto_masked": {...}, "perfedavg": {"global", "personal"}}}.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from benchmarks._common import emit, log

TASKS = {
    "hospital": {"data.dataset": "breast_cancer", "data.clients": 4, "data.partition": "dirichlet",
                 "data.alpha": 0.3},
    "digits": {"data.dataset": "digits", "data.clients": 10, "data.partition": "shards",
               "data.shards_per_client": 2},
}
LAMBDAS = (0.0, 0.01, 0.1, 1.0, 10.0, 1000.0)
COMMON = {"dp.mode": "none", "secure.aggregation": "none", "train.batch_size": 16, "train.lr": 0.1}


def _personal(values: dict[str, Any]) -> dict[str, float]:
    from fedsec.config import make_config
    from fedsec.experiment import run_experiment

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entry = run_experiment(make_config(values))["personalization"]
    return {"global": round(entry["mean_global_accuracy"], 4),
            "personal": round(entry["mean_personal_accuracy"], 4)}


def run(quick: bool = False) -> dict[str, Any]:
    """The table: per task, FedAvg's mean per-client accuracy, Ditto's over lambda, Per-FedAvg's."""
    import torch

    torch.set_num_threads(1)
    rounds = 8 if quick else 30
    lambdas = (0.0, 0.1, 1000.0) if quick else LAMBDAS
    result: dict[str, Any] = {"settings": {"rounds": rounds, "holdout": 0.25, "model": "logreg",
                                           "local_epochs": 1, "batch_size": 16, "lr": 0.1,
                                           "personal_lr": 0.1, "personal_epochs": 1,
                                           "perfedavg": {"alpha": 0.05, "beta": 0.1, "steps": 5,
                                                         "adapt_steps": 5}}}
    for task, data in TASKS.items():
        base = {**COMMON, **data, "rounds": rounds}
        ditto = {}
        for lam in lambdas:
            ditto[repr(lam)] = _personal({**base, "train.algorithm": "ditto", "personal.lam": lam})
            log(f"{task} ditto lambda={lam}: {ditto[repr(lam)]}")
        masked = _personal({**base, "train.algorithm": "ditto", "personal.lam": 0.1,
                            "secure.aggregation": "masking"})
        per = _personal({**base, "train.algorithm": "perfedavg", "personal.lr": 0.05,
                         "personal.steps": 5, "personal.adapt_steps": 5})
        log(f"{task} ditto masked lambda=0.1: {masked}; perfedavg: {per}")
        result[task] = {"fedavg": ditto[repr(lambdas[0])]["global"], "ditto": ditto,
                        "ditto_masked_lambda_0.1": masked, "perfedavg": per}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and lambdas")
    emit(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
