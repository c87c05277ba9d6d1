"""Cost of the audit log: the default ``fedsec run`` (with a run directory) with and without
``audit.db``, interleaved in one process, median of ``--repeats`` runs each.

    python -m benchmarks.audit [--repeats 3] [--rounds R]

The last line is one JSON object: the median wall seconds of each, the overhead in percent
(budget: 5 %), the events written, the median time of one signed, fsynced append, and
``append_bound_percent``: the transactions a run writes (one per round, three more) times that
append time over the run's wall time, the cost of the log without the machine's timing noise
(on a loaded machine the difference of two medians can be larger than the log's cost, either way).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._common import emit, log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=0, help="0 = the default run's rounds")
    args = parser.parse_args()

    from fedsec.secagg.keys import SigningKey

    from fedsec.audit.log import AuditLog
    from fedsec.config import ExperimentConfig, make_config
    from fedsec.experiment import run_experiment

    config = make_config({"rounds": args.rounds}) if args.rounds else ExperimentConfig()
    root = Path(tempfile.mkdtemp(prefix="fedsec-audit-bench-"))
    times: dict[str, list[float]] = {"with_audit": [], "without_audit": []}
    events = 0
    try:
        run_experiment(config, out=root / "warm", audit=False)  # imports, data caches
        for i in range(args.repeats):
            for name in ("without_audit", "with_audit"):
                start = time.perf_counter()
                summary = run_experiment(config, out=root / f"{name}{i}", audit=name == "with_audit")
                times[name].append(time.perf_counter() - start)
                if name == "with_audit":
                    events = summary["audit"]["events"]
                log(f"{name} {i}: {times[name][-1]:.3f} s")
        appends = []
        with AuditLog(root / "append.db", actor="bench", key=SigningKey.generate(), run_id="b") as audit:
            for r in range(50):
                start = time.perf_counter()
                audit.append("round", round=r, details={"upload_bytes": 5228, "model_sha256": "ab" * 32})
                appends.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with_audit = statistics.median(times["with_audit"])
    without = statistics.median(times["without_audit"])
    emit({"benchmark": "audit", "rounds": config.rounds, "repeats": args.repeats,
          "wall_s_without_audit": round(without, 4), "wall_s_with_audit": round(with_audit, 4),
          "overhead_percent": round(100 * (with_audit - without) / without, 2), "budget_percent": 5.0,
          "events": events, "append_ms_median": round(1000 * statistics.median(appends), 3),
          "append_bound_percent": round(100 * (config.rounds + 3) * statistics.median(appends) / without,
                                        2)})


if __name__ == "__main__":
    main()
