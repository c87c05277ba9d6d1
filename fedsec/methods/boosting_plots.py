"""Plots of a boosting run: linear coefficient paths and the fitted P-spline partial effects."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedsec.fl_core.boosting import BoostingFit  # noqa: E402
from fedsec.fl_core.boosting_learners import LinearLearner, PSplineLearner  # noqa: E402

MAX_CURVES = 8
"""Most learners drawn per panel (the most often selected ones)."""


def plot_coefficient_paths(fit: BoostingFit, *, path: str | Path, title: str,
                           feature_names: list[str] | None = None) -> None:
    """Panels: the slope of every selected linear learner per iteration; the size of every selected
    P-spline's partial function per iteration (its root mean square over the public knot range);
    and the final partial functions f_j(x) of those P-splines over that range."""
    learners = fit.model.learners
    counts = fit.selection_counts()
    names = feature_names or [f"x{j}" for j in range(max(lr.feature for lr in learners) + 1)]
    offsets = np.cumsum([1] + [lr.size for lr in learners])
    iterations = np.arange(1, fit.path.shape[0] + 1)
    ranked = sorted((j for j, lr in enumerate(learners) if lr.name in counts),
                    key=lambda j: -counts[learners[j].name])
    linear = [j for j in ranked if isinstance(learners[j], LinearLearner)][:MAX_CURVES]
    splines = [j for j in ranked if isinstance(learners[j], PSplineLearner)][:MAX_CURVES]
    panels = int(bool(linear)) + 2 * int(bool(splines)) or 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), dpi=100, squeeze=False)
    ax_iter = iter(axes[0])
    if linear:
        ax = next(ax_iter)
        for j in linear:
            ax.plot(iterations, fit.path[:, offsets[j] + 1], linewidth=1.5,
                    label=f"{names[learners[j].feature]} ({counts[learners[j].name]}x)")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel("boosting iteration")
        ax.set_ylabel("slope (standardised feature)")
        ax.set_title("linear learners: coefficient paths", fontsize=9)
        ax.legend(fontsize=7)
    if splines:
        ax = next(ax_iter)
        for j in splines:
            learner = learners[j]
            grid = np.zeros((200, learner.feature + 1))
            grid[:, learner.feature] = np.linspace(-learner.spline_range, learner.spline_range, 200)
            values = learner.design(grid) @ fit.path[:, offsets[j]:offsets[j + 1]].T
            ax.plot(iterations, np.sqrt(np.mean(values**2, axis=0)), linewidth=1.5,
                    label=f"{names[learner.feature]} ({counts[learner.name]}x)")
        ax.set_xlabel("boosting iteration")
        ax.set_ylabel("RMS of f_j over the knot range")
        ax.set_title("P-spline learners: paths", fontsize=9)
        ax.legend(fontsize=7)
        ax = next(ax_iter)
        for j in splines:
            learner = learners[j]
            grid = np.linspace(-learner.spline_range, learner.spline_range, 200)
            columns = np.zeros((grid.size, learner.feature + 1))
            columns[:, learner.feature] = grid
            ax.plot(grid, learner.design(columns) @ fit.model.coefficients[j], linewidth=1.5,
                    label=f"{names[learner.feature]} ({counts[learner.name]}x)")
        ax.set_xlabel("standardised feature value")
        ax.set_ylabel("partial effect f_j(x)")
        ax.set_title("P-spline learners: fitted partial effects", fontsize=9)
        ax.legend(fontsize=7)
    if not linear and not splines:
        axes[0][0].text(0.5, 0.5, "no learner selected", ha="center")
    fig.suptitle("\n".join(textwrap.wrap(title, 60 * panels)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, metadata={"Title": title})
    plt.close(fig)
