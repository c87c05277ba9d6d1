"""From a privacy target to noise: the smallest noise whose epsilon does not exceed the target.

Epsilon falls as the noise grows, so a bisection on the noise bracket, keeping the upper end
(whose epsilon is always <= target), never overshoots. The bisection stops when the bracket is
within 0.1% (or ``tolerance``); each evaluation is a full accountant run.
"""

from __future__ import annotations

from collections.abc import Callable

from fedsec.dp.accountants import check_delta, check_target, epsilon
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER

MAX_NOISE = 1e6


def smallest_noise(epsilon_of: Callable[[float], float], target_epsilon: float, *,
                   low: float = 0.05, tolerance: float = 1e-3) -> float:
    """The smallest noise x in [low, 1e6] (to ``tolerance`` relative) with epsilon_of(x) <= target.

    ``epsilon_of`` must be non-increasing in x. Raises InvalidPrivacyParameterError if even the
    largest noise exceeds the target.
    """
    check_target(target_epsilon)
    high = max(low, 1.0)
    while epsilon_of(high) > target_epsilon:
        low, high = high, high * 2
        if high > MAX_NOISE:
            raise InvalidPrivacyParameterError(
                f"no noise up to {MAX_NOISE:g} reaches epsilon <= {target_epsilon}")
    if epsilon_of(low) <= target_epsilon:
        return low
    while high - low > tolerance * high:
        mid = (low + high) / 2
        if epsilon_of(mid) <= target_epsilon:
            high = mid
        else:
            low = mid
    return high


def noise_multiplier_for(*, target_epsilon: float, delta: float, sample_rates: list[float],
                         steps: list[int], mechanism: str = "pld") -> float:
    """The noise multiplier for which every party's epsilon (its own sampling rate and number
    of steps) stays <= ``target_epsilon`` at ``delta``."""
    check_delta(delta)
    if not sample_rates or len(sample_rates) != len(steps):
        raise InvalidPrivacyParameterError("need one sampling rate and one step count per party")
    parties = sorted(set(zip(sample_rates, steps, strict=True)))

    def worst(sigma: float) -> float:
        return max(epsilon(noise_multiplier=sigma, sample_rate=q, steps=t, delta=delta,
                           mechanism=mechanism) for q, t in parties)

    return smallest_noise(worst, target_epsilon, low=MIN_NOISE_MULTIPLIER)
