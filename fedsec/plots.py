"""PNG plots of a run's history (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fl_core.history import RoundRecord  # noqa: E402


def plot_metric(
    records: Sequence[RoundRecord],
    *,
    metric: str,
    path: str | Path,
    title: str,
    ylabel: str,
    target: float | None = None,
) -> None:
    """Plot ``metric`` (a RoundRecord attribute or a ``metrics`` key) per round into ``path``."""
    rounds = [r.round for r in records]
    values = [getattr(r, metric) if hasattr(r, metric) else r.metrics.get(metric) for r in records]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(rounds, values, marker="o", markersize=3, linewidth=1.5)
    if target:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.legend(loc="lower right")
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_tradeoff(points: Sequence[tuple[float, float, float]], *, path: str | Path, title: str,
                  baseline: float | None = None) -> None:
    """Accuracy against epsilon: (epsilon, mean accuracy, standard deviation) per point, and the
    non-private accuracy as a dashed line."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    eps = [p[0] for p in points]
    ax.errorbar(eps, [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                markersize=4, capsize=3, linewidth=1.5, label="private")
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="no DP")
    ax.set_xscale("log")
    ax.set_xticks(eps, [f"{e:.3g}" for e in eps])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("epsilon spent")
    ax.set_ylabel("final test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
