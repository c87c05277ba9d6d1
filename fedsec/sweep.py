"""Privacy-utility sweeps: one run per (target epsilon, seed), plus a non-private baseline.

Every private run calibrates its noise to spend its target over ``rounds``; the sweep writes
``sweep.csv`` (one row a run) and ``sweep.png`` (final accuracy against the epsilon actually
spent, mean and standard deviation over seeds, the non-private mean as a dashed line).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.experiment import run_experiment
from fedsec.plots import plot_tradeoff

SWEEP_COLUMNS = ("target_epsilon", "seed", "epsilon", "epsilon_rdp", "noise_multiplier",
                 "final_accuracy", "best_accuracy", "rounds_run", "stop_reason")


def run_sweep(config: ExperimentConfig, *, epsilons: Sequence[float], seeds: Sequence[int],
              out: str | Path, progress: bool = False) -> dict[str, Any]:
    """Run the sweep into ``out``; returns the points and the baseline."""
    if config.dp.mode == "none":
        raise ConfigError("dp.mode", "a sweep needs dp.mode = 'dpsgd' or 'client'")
    if not epsilons or any(e <= 0 for e in epsilons) or not seeds:
        raise ConfigError("sweep", "give at least one epsilon > 0 and one seed")
    from tqdm import tqdm

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [(e, s) for e in sorted(epsilons) for s in seeds]
    rows, baseline = [], []
    bar = tqdm(total=len(runs) + len(seeds), desc="sweep", disable=not progress, leave=False)
    for seed in seeds:
        plain = replace(config, seed=seed, dp=replace(config.dp, mode="none", noise_multiplier=0.0,
                                                      target_epsilon=0.0, max_grad_norm=1.0,
                                                      accountant="pld", reproducible=False,
                                                      delta=1e-5))
        baseline.append(run_experiment(plain)["final_accuracy"])
        bar.update()
    for target, seed in runs:
        private = replace(config, seed=seed,
                          dp=replace(config.dp, target_epsilon=target, noise_multiplier=0.0))
        summary = run_experiment(private)
        p = summary["privacy"]
        rows.append({"target_epsilon": target, "seed": seed, "epsilon": p["epsilon"],
                     "epsilon_rdp": p["epsilon_rdp"], "noise_multiplier": p["noise_multiplier"],
                     "final_accuracy": summary["final_accuracy"],
                     "best_accuracy": summary["best_accuracy"], "rounds_run": summary["rounds_run"],
                     "stop_reason": summary["stop_reason"]})
        bar.update()
    bar.close()
    with open(out_dir / "sweep.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SWEEP_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    points = []
    for target in sorted(epsilons):
        group = [r for r in rows if r["target_epsilon"] == target]
        accs = [r["final_accuracy"] for r in group]
        points.append((statistics.fmean(r["epsilon"] for r in group), statistics.fmean(accs),
                       statistics.pstdev(accs)))
    base = statistics.fmean(baseline)
    d = config.data
    plot_tradeoff(points, path=out_dir / "sweep.png", baseline=base,
                  title=f"{d.dataset}, {d.clients} clients, {config.model.name}, "
                        f"{config.dp.mode} ({len(seeds)} seeds)")
    (out_dir / "config.toml").write_text(config.to_toml())
    return {"points": [{"epsilon": e, "accuracy": a, "std": s} for e, a, s in points],
            "baseline_accuracy": base, "runs": len(rows)}
