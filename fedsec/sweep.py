"""Privacy-utility sweeps: one run per (target epsilon, seed), plus a non-private baseline.

Every private run calibrates its noise to spend its target over ``rounds``; the sweep writes
``sweep.csv`` (one row a run, written as it finishes: the non-private baseline rows first, with
``dp_mode = none`` and blank privacy columns) and ``sweep.png`` (final accuracy against the
epsilon actually spent, mean and standard deviation over seeds, the non-private mean as a dashed
line). The output folder follows the rules of :mod:`fedsec.rundir` (refused if non-empty without
``force``, swapped in whole at the end). With ``sim.backend = "ray"`` the runs are Ray tasks
that run in parallel (:mod:`fedsec.backends.ray_sweep`); their rows are the local backend's, in
the order they finish.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.experiment import run_experiment
from fedsec.plots import plot_tradeoff, privacy_label
from fedsec.rundir import RunDirectory

SWEEP_COLUMNS = ("dp_mode", "target_epsilon", "seed", "epsilon", "epsilon_rdp", "noise_multiplier",
                 "final_accuracy", "best_accuracy", "rounds_run", "stop_reason")


def run_sweep(config: ExperimentConfig, *, epsilons: Sequence[float], seeds: Sequence[int],
              out: str | Path, progress: bool = False, force: bool = False) -> dict[str, Any]:
    """Run the sweep into ``out``; returns the points and the baseline.

    Raises:
        ConfigError: a non-private configuration, no epsilon or seed, or an unusable ``out``
            (checked before any run).
    """
    if config.dp.mode == "none":
        raise ConfigError("dp.mode", "a sweep needs dp.mode = 'dpsgd' or 'client'")
    if not epsilons or any(e <= 0 for e in epsilons) or not seeds:
        raise ConfigError("sweep", "give at least one epsilon > 0 and one seed")
    staging = RunDirectory(out, force=force)
    try:
        result = _sweep(config, epsilons, seeds, staging.path, progress)
    except KeyboardInterrupt:
        staging.publish()  # the finished runs' rows of sweep.csv are kept
        raise
    except BaseException:
        staging.discard()
        raise
    staging.publish()
    return result


def _sweep(config: ExperimentConfig, epsilons: Sequence[float], seeds: Sequence[int], out_dir: Path,
           progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    runs = [(e, s) for e in sorted(epsilons) for s in seeds]
    rows: list[dict[str, Any]] = []
    baseline = []
    bar = tqdm(total=len(runs) + len(seeds), desc="sweep", disable=not progress, leave=False)
    (out_dir / "config.toml").write_text(config.to_toml())
    table = _Table(out_dir / "sweep.csv")
    plain = [replace(config, seed=seed, dp=replace(config.dp, mode="none", noise_multiplier=0.0,
                                                   target_epsilon=0.0, max_grad_norm=1.0,
                                                   accountant="pld", reproducible=False, delta=1e-5))
             for seed in seeds]
    private = [replace(config, seed=seed, dp=replace(config.dp, target_epsilon=target, noise_multiplier=0.0))
               for target, seed in runs]
    held: list[dict[str, Any]] = []  # private rows that finished before every baseline row was written
    for index, summary in _summaries([*plain, *private], config):
        summary = _finished(summary)
        if index < len(seeds):
            baseline.append(summary["final_accuracy"])
            rows.append(table.add({"dp_mode": "none", "target_epsilon": "", "seed": seeds[index],
                                   "epsilon": "", "epsilon_rdp": "", "noise_multiplier": "",
                                   **_outcome(summary)}))
            if len(baseline) == len(seeds):
                rows.extend(table.add(row) for row in held)
                held = []
        else:
            target, seed = runs[index - len(seeds)]
            p = summary["privacy"]
            row = {"dp_mode": config.dp.mode, "target_epsilon": target, "seed": seed,
                   "epsilon": p["epsilon"], "epsilon_rdp": p["epsilon_rdp"],
                   "noise_multiplier": p["noise_multiplier"], **_outcome(summary)}
            if len(baseline) == len(seeds):
                rows.append(table.add(row))
            else:
                held.append(row)
        bar.update()
    bar.close()
    return _write(config, rows, baseline, epsilons, seeds, out_dir)


def _summaries(configs: Sequence[ExperimentConfig], config: ExperimentConfig
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, summary)`` of every run: one after another here (``sim.backend = "local"``), or
    in parallel as Ray tasks, as they finish (``"ray"``; :mod:`fedsec.backends.ray_sweep`)."""
    if config.sim.backend == "ray":
        from fedsec.backends.ray_sweep import run_parallel

        yield from run_parallel(configs, sim=config.sim)
        return
    for index, run in enumerate(configs):
        yield index, run_experiment(run)


class _Table:
    """``sweep.csv`` written row by row (flushed and fsynced), so an interrupted sweep keeps the
    rows of its finished runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "w", newline="") as handle:
            csv.DictWriter(handle, fieldnames=SWEEP_COLUMNS).writeheader()

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        with open(self.path, "a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=SWEEP_COLUMNS).writerow(row)
            handle.flush()
            os.fsync(handle.fileno())
        return row


def _finished(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run that ran to its end; Ctrl-C inside the run ends the sweep."""
    if summary["stop_reason"] == "interrupted":
        raise KeyboardInterrupt
    return summary


def _outcome(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("final_accuracy", "best_accuracy", "rounds_run", "stop_reason")
    return {k: summary[k] for k in keys}


def _write(config: ExperimentConfig, rows: list[dict[str, Any]], baseline: list[float],
           epsilons: Sequence[float], seeds: Sequence[int], out_dir: Path) -> dict[str, Any]:
    """Write sweep.png into ``out_dir`` (sweep.csv and config.toml are written); returns the points."""
    points = []
    for target in sorted(epsilons):
        group = [r for r in rows if r["dp_mode"] != "none" and r["target_epsilon"] == target]
        accs = [r["final_accuracy"] for r in group]
        points.append((statistics.fmean(r["epsilon"] for r in group), statistics.fmean(accs),
                       statistics.pstdev(accs)))
    base = statistics.fmean(baseline)
    d = config.data
    settings = privacy_label(replace(config, dp=replace(config.dp, target_epsilon=0.0)), None)
    plot_tradeoff(points, path=out_dir / "sweep.png", baseline=base,
                  title=f"{d.dataset}, {d.clients} clients, {config.model.name}, {len(seeds)} "
                        f"seeds\n{settings}")
    return {"points": [{"epsilon": e, "accuracy": a, "std": s} for e, a, s in points],
            "baseline_accuracy": base, "runs": len(rows) - len(seeds)}
