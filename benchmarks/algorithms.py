"""The five seed methods of the course material, each against its baseline, in one JSON object.

    python -m benchmarks.algorithms [--quick] [--only boosting,cocoa,...]

Keys of the last stdout line (each method's own benchmark module documents its settings):

- ``boosting``: the largest coefficient difference between the federated fit (plain, masking,
  Paillier) and an independent centralised fit on the pooled data (``benchmarks.algo_boosting``);
- ``cocoa``: communication rounds to a suboptimality of 1e-3 for CoCoA / CoCoA+ and for
  mini-batch SGD and FedSGD on the same data (``benchmarks.algo_cocoa``);
- ``mocha``: mean per-client test accuracy of MOCHA against one global FedAvg model and local-only
  models (``benchmarks.algo_mocha``);
- ``personalization``: mean per-client accuracy before and after personalization (Ditto over
  lambda, Per-FedAvg) against FedAvg (``benchmarks.algo_personalization``);
- ``robust``: accuracy of the mean, median, trimmed mean and norm-bounded masking with 1 of 4 and
  3 of 10 clients Byzantine (``benchmarks.algo_robust``);
- ``seconds``: wall time of each method's part.
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

from benchmarks._common import emit, log

METHODS = ("boosting", "cocoa", "mocha", "personalization", "robust")


def run(quick: bool = False, only: tuple[str, ...] = METHODS) -> dict[str, Any]:
    """Run each method's benchmark (``quick``: the smaller settings each module defines)."""
    result: dict[str, Any] = {"seconds": {}}
    for name in only:
        module = importlib.import_module(f"benchmarks.algo_{name}")
        log(f"== {name}")
        start = time.perf_counter()
        result[name] = module.run(quick=quick)
        result["seconds"][name] = round(time.perf_counter() - start, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="each method's quick settings")
    parser.add_argument("--only", default=",".join(METHODS),
                        help=f"comma-separated subset of {', '.join(METHODS)}")
    args = parser.parse_args()
    only = tuple(m.strip() for m in args.only.split(",") if m.strip())
    unknown = sorted(set(only) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    emit(run(quick=args.quick, only=only))


if __name__ == "__main__":
    main()
