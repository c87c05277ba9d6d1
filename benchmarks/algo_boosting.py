"""Federated component-wise boosting against the centralised fit on the pooled data.

Breast cancer, 4 hospitals (iid and unbalanced partitions), features standardised with the
federated moments, binomial loss, linear and P-spline learners (20 inner knots, cubic, df 4),
nu = 0.1. The centralised fit is the same algorithm run on the pooled samples in one place (one
party, float64, no aggregation layer); tests/fl_core/test_boosting.py checks that one against an
independently written reference. Each aggregation layer (plain, pairwise masking, Paillier)
runs the federated fit; the headline is the largest absolute coefficient difference from the
centralised fit (the quantisation of the statistics encoder), together with whether every
iteration selected the same learner.

    python -m benchmarks.algo_boosting [--quick]

Last stdout line: {"boosting": {"iid": {"plain": {...}, "masking": {...}, "paillier": {...}},
"unbalanced": {...}, "iid_linear_learners": {...}, "max_coefficient_difference": ..., ...}}.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from fedsec.fl_core.boosting import BoostingFit, BoostingSpec, FederatedBoosting
from fedsec.fl_core.standardize import apply_standardization, federated_moments

from benchmarks._common import emit, log
from fedsec import fl_core

CLIENTS = 4
SPEC = BoostingSpec(family="binomial", learners="both", nu=0.1, df=4.0, inner_knots=20)


def _protocol(name: str, data: fl_core.FederatedDataset, seed: int, quick: bool
              ) -> fl_core.AggregationProtocol:
    max_weight = max(len(c) for c in data.clients)
    rng = np.random.default_rng(seed)
    if name == "masking":
        from fedsec.protocols.masked import MaskedAggregation

        return MaskedAggregation(max_weight=max_weight, rng=rng)
    if name == "paillier":
        from fedsec.protocols.paillier import PaillierAggregation

        return PaillierAggregation(max_weight=max_weight, rng=rng, threshold=2,
                                   key_bits=1024 if quick else 2048, parties=range(CLIENTS),
                                   allow_insecure_key=quick)
    return fl_core.PlainAggregation()


def _accuracy(fit: BoostingFit, test: fl_core.ArrayDataset) -> float:
    return float(np.mean(fit.model.predict(test.x) == test.y))


def compare(partition: str, *, iterations: int, protocols: tuple[str, ...], seed: int,
            quick: bool, spec: BoostingSpec = SPEC) -> dict[str, Any]:
    """Federated fits under ``protocols`` against the centralised fit on one partition."""
    data = fl_core.load_federated("breast_cancer", n_clients=CLIENTS, partition=partition,
                                  test_fraction=0.2, rng=np.random.default_rng(seed))
    mean, std, _ = federated_moments(data, fl_core.PlainAggregation())
    data = apply_standardization(data, mean, std)
    start = time.perf_counter()
    central = FederatedBoosting(spec=spec, protocol=fl_core.PlainAggregation(),
                                iterations=iterations).fit([data.pooled()])
    central_seconds = time.perf_counter() - start
    reference = central.model.flat_coefficients()
    out: dict[str, Any] = {
        "centralised": {"test_accuracy": _accuracy(central, data.test),
                        "seconds": round(central_seconds, 3),
                        "selected": sorted(central.selection_counts().items(),
                                           key=lambda kv: -kv[1])},
        "clients": [len(c) for c in data.clients],
    }
    for name in protocols:
        start = time.perf_counter()
        fit = FederatedBoosting(spec=spec, protocol=_protocol(name, data, seed, quick),
                                iterations=iterations).fit(data.clients)
        seconds = time.perf_counter() - start
        diff = np.abs(fit.model.flat_coefficients() - reference)
        same = [s.selected for s in fit.steps] == [s.selected for s in central.steps]
        out[name] = {
            "max_coefficient_difference": float(diff.max()),
            "relative_difference": float(diff.max() / np.abs(reference).max()),
            "same_selection_every_iteration": same,
            "test_accuracy": _accuracy(fit, data.test),
            "upload_bytes_per_iteration": int(np.mean([s.upload_bytes for s in fit.steps])),
            "setup_upload_bytes": fit.setup_upload_bytes,
            "seconds": round(seconds, 3),
        }
        log(f"{partition} {spec.learners} {name}: max |diff| {diff.max():.3g}, same selection {same}, "
            f"{seconds:.2f} s")
    return out


def run(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """The headline figures: the largest coefficient difference from the centralised fit."""
    iterations = 30 if quick else 100
    protocols = ("plain", "masking", "paillier")
    partitions = ("iid",) if quick else ("iid", "unbalanced")
    result: dict[str, Any] = {"iterations": iterations, "clients": CLIENTS,
                              "learners": SPEC.learners, "family": SPEC.family, "nu": SPEC.nu,
                              "paillier_key_bits": 1024 if quick else 2048}
    for partition in partitions:
        result[partition] = compare(partition, iterations=iterations, protocols=protocols,
                                    seed=seed, quick=quick)
    linear = BoostingSpec(family="binomial", learners="linear", nu=0.1)
    result["iid_linear_learners"] = compare("iid", iterations=iterations, protocols=("plain", "masking"),
                                            seed=seed, quick=quick, spec=linear)
    result["max_coefficient_difference"] = {
        name: max(result[p][name]["max_coefficient_difference"] for p in partitions)
        for name in protocols}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 iterations, iid only, 1024-bit keys")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    emit({"boosting": run(quick=args.quick, seed=args.seed)})


if __name__ == "__main__":
    main()
