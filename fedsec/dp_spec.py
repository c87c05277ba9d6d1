"""``fedsec.DP``: the differential-privacy settings of a :class:`fedsec.Federation`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedsec.dp import ACCOUNTANTS
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER

DP_MODES = ("dpsgd", "client")


@dataclass(frozen=True)
class DP:
    """Differential privacy for a federation, validated at once (a bad value raises ValueError
    naming the key).

    Args:
        mode: ``dpsgd`` (example-level: each client runs DP-SGD on its own data; one epsilon
            protects one record of one client) or ``client`` (client-level: each client's whole
            update is clipped and the released sum carries noise; one epsilon protects a client).
        target_epsilon: the budget epsilon > 0 at ``delta``; the noise is calibrated to spend it
            over the federation's rounds, and the run stops before exceeding it. None: no target
            (then ``noise_multiplier`` is required and epsilon is only reported).
        delta: in (0, 1), e.g. well below 1 / (records of the largest client).
        max_grad_norm: L2 clip C > 0: per example (dpsgd) or per client update (client).
        noise_multiplier: sigma >= 0.5, fixed noise (noise std / C); None = calibrated (never
            below 0.5).
        accountant: ``pld``, ``prv`` or ``rdp``.
        reproducible: draw noise from the seed (experiments only: not private against whoever
            knows the seed).
    """

    mode: str = "dpsgd"
    target_epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    accountant: str = "pld"
    reproducible: bool = False

    def __post_init__(self) -> None:
        if self.mode not in DP_MODES:
            raise ValueError(f"mode must be one of {DP_MODES}, got {self.mode!r}")
        if self.target_epsilon is not None and not _positive(self.target_epsilon):
            raise ValueError(f"target_epsilon must be a finite number > 0 or None, "
                             f"got {self.target_epsilon!r}")
        if not (_number(self.delta) and 0 < self.delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not _positive(self.max_grad_norm):
            raise ValueError(f"max_grad_norm must be a finite number > 0, got {self.max_grad_norm!r}")
        if self.noise_multiplier is not None and not (
                _positive(self.noise_multiplier) and self.noise_multiplier >= MIN_NOISE_MULTIPLIER):
            raise ValueError(f"noise_multiplier must be a finite number >= {MIN_NOISE_MULTIPLIER} "
                             f"(the Gaussian sampler is truncated at 8.57 standard deviations) or "
                             f"None, got {self.noise_multiplier!r}")
        if self.target_epsilon is None and self.noise_multiplier is None:
            raise ValueError("target_epsilon: give target_epsilon (noise calibrated to spend it), "
                             "noise_multiplier, or both")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {tuple(ACCOUNTANTS)}, got {self.accountant!r}")
        if not isinstance(self.reproducible, bool):
            raise ValueError(f"reproducible must be True or False, got {self.reproducible!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: object) -> bool:
    return _number(value) and value > 0  # type: ignore[operator]
