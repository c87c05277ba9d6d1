"""PNG plots of a run's history (matplotlib, no display needed)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fedsec.config import ExperimentConfig  # noqa: E402
from fedsec.fl_core.history import RoundRecord  # noqa: E402

TITLE_WIDTH = 68
"""Characters per title line; longer lines are wrapped."""


def plot_metric(
    records: Sequence[RoundRecord],
    *,
    metric: str,
    path: str | Path,
    title: str,
    ylabel: str,
    target: float | None = None,
    target_label: str = "target",
) -> None:
    """Plot ``metric`` (a RoundRecord attribute or a ``metrics`` key) per round into ``path``.

    The PNG carries the title and the aborted rounds as text metadata (``Title``, ``Description``).
    """
    fig = metric_figure(records, metric=metric, title=title, ylabel=ylabel, target=target,
                        target_label=target_label)
    aborted = ",".join(str(r.round) for r in records if r.status != "ok") or "none"
    fig.savefig(path, metadata={"Title": title, "Description": f"aborted rounds: {aborted}"})
    plt.close(fig)


def metric_figure(
    records: Sequence[RoundRecord],
    *,
    metric: str,
    title: str,
    ylabel: str,
    target: float | None = None,
    target_label: str = "target",
) -> Figure:
    """The figure of :func:`plot_metric`: aborted rounds (no sum released, model unchanged) get a
    red cross on the curve and a shaded band; ``target`` is a dashed line labelled
    ``target_label``."""
    rounds = [r.round for r in records]
    values = [_value(r, metric) for r in records]
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=100)
    ax.plot(rounds, values, marker="o", markersize=3, linewidth=1.5, label=metric)
    aborted = [(r.round, v) for r, v in zip(records, values, strict=True) if r.status != "ok"]
    if aborted:
        for number, _ in aborted:
            ax.axvspan(number - 0.5, number + 0.5, color="tab:red", alpha=0.12, linewidth=0)
        ax.plot([a[0] for a in aborted], [a[1] for a in aborted], "x", color="tab:red",
                markersize=7, label=f"aborted round ({len(aborted)})")
    if target:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"{target_label} {target:g}")
    if target or aborted:
        ax.legend(loc="best")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.fill(line, TITLE_WIDTH) for line in title.split("\n")),
                 fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _value(record: RoundRecord, metric: str) -> float:
    value = getattr(record, metric) if hasattr(record, metric) else record.metrics.get(metric)
    return float("nan") if value is None else float(value)


def privacy_label(config: ExperimentConfig, noise_multiplier: float | None) -> str:
    """One line naming a run's privacy settings, e.g. ``masking; DP-SGD (example level): target
    epsilon 3, delta 1e-05, sigma 3, clip 1``."""
    s, p = config.secure, config.dp
    layer = {"none": "no secure aggregation", "masking": f"masking ({s.graph})",
             "paillier": f"Paillier ({s.custody})"}[s.aggregation]
    if p.mode == "none":
        return f"{layer}; no DP"
    kind = "DP-SGD (example level)" if p.mode == "dpsgd" else "client-level DP"
    target = f"target epsilon {p.target_epsilon:g}, " if p.target_epsilon else ""
    sigma = f", sigma {noise_multiplier:.3g}" if noise_multiplier is not None else ""
    return f"{layer}; {kind}: {target}delta {p.delta:g}{sigma}, clip {p.max_grad_norm:g}"


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
