"""Byzantine hospitals: accuracy of the mean, median, trimmed mean and norm-bounded masking.

The hospital task (breast cancer, IID, logistic regression, E = 1, B = 16, lr 0.1, no DP), with 1
of 4 and 3 of 10 clients Byzantine (picked from the seed, the same for every rule). Attacks, made on
the client before its update enters the unmodified protocol: ``sign_flip`` (-u), ``scale`` (10 u),
``noise`` (N(0, s^2 I), s = 100 x the honest update's RMS coordinate). Rules: ``mean`` (plain sum),
``median`` and ``trimmed_mean`` (trim 0.3; plain only), ``masked_mean`` (masking with its coordinate
clip only), ``norm_bound_masked`` (masking with each update clipped to L2 norm 0.5 on the client).
Each figure is the test accuracy averaged over the last 5 rounds; ``honest`` is the same rule with
no Byzantine client, measured in the same run.

    python -m benchmarks.algo_robust [--quick]

Last stdout line: {"settings": {...}, "1_of_4": {"honest": {rule: acc}, "sign_flip": {...},
"scale": {...}, "noise": {...}}, "3_of_10": {...}}.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import numpy as np

from benchmarks._common import emit, log

RULES = {
    "mean": {"secure.aggregation": "none"},
    "median": {"secure.aggregation": "none", "robust.rule": "median"},
    "trimmed_mean": {"secure.aggregation": "none", "robust.rule": "trimmed_mean", "robust.trim": 0.3},
    "masked_mean": {"secure.aggregation": "masking"},
    "norm_bound_masked": {"secure.aggregation": "masking", "robust.rule": "norm_bound",
                          "robust.norm_bound": 0.5},
}
ATTACKS = {"sign_flip": {}, "scale": {"robust.factor": 10.0}, "noise": {"robust.factor": 100.0}}
SETTINGS = {"1_of_4": (4, 1), "3_of_10": (10, 3)}


def _accuracy(values: dict[str, Any], last: int) -> float:
    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = build_experiment(make_config(values)).server.run().records
    return round(float(np.mean([r.accuracy for r in records[-last:]])), 4)


def run(quick: bool = False) -> dict[str, Any]:
    """The accuracy table: per setting and attack (and honest), per rule."""
    import torch

    torch.set_num_threads(1)
    rounds, last = (8, 3) if quick else (20, 5)
    result: dict[str, Any] = {"settings": {"dataset": "breast_cancer", "partition": "iid",
                                           "rounds": rounds, "averaged_over_last_rounds": last,
                                           "trim": 0.3, "norm_bound": 0.5, "secure_clip": 1.0,
                                           "scale_factor": 10.0, "noise_factor": 100.0}}
    for name, (clients, bad) in SETTINGS.items():
        base = {"dp.mode": "none", "rounds": rounds, "data.clients": clients}
        table: dict[str, dict[str, float]] = {}
        table["honest"] = {rule: _accuracy({**base, **extra}, last) for rule, extra in RULES.items()}
        for attack, knobs in ATTACKS.items():
            table[attack] = {
                rule: _accuracy({**base, **extra, **knobs, "robust.byzantine": bad,
                                 "robust.attack": attack}, last)
                for rule, extra in RULES.items()}
            log(f"{name} {attack}: {table[attack]}")
        result[name] = table
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 rounds instead of 20")
    emit(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
