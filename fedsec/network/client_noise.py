"""Client-level DP in a deployment: the rule by which a site draws its share of the noise.

A site clips its update to the plan's L2 bound S (``dp.max_grad_norm``), weights it 1, and adds
to its encoded words a shifted Skellam share of variance mu / t before the secure layer masks
them, where

- mu = (z D2)^2 is the noise the plan's accountant charges for one round: z is the noise
  multiplier the coordinator calibrated, accepted only after the site recomputed its own epsilon
  over the plan's rounds with it (:meth:`fedsec.network.site_work.SiteWork.start`), and D2 the L2
  sensitivity in encoder units from the site's own copy of the plan (bits, coordinate clip c,
  S, the model's length): :func:`fedsec.protocols.privacy.client_level.sensitivity`;
- t is the threshold of the masked session the site takes part in: the site's own
  :class:`~fedsec.protocols.masked.MaskedClient` refuses a t below its floor (its policy's
  ``min_threshold``, the plan's, the corrupt-fraction floor) and never helps unmask a sum of
  fewer than t inputs, so every sum the coordinator can release holds at least t shares of
  variance mu / t: at least mu, whatever t, ring or noise multiplier the coordinator claims. A
  larger t buys the coordinator smaller shares only at the price of a larger sum.

This is the simulation's rule (:class:`~fedsec.protocols.privacy.ClientLevelDP`: the threshold
of the round actually run), so with ``dp.reproducible`` the deployed history is ``fedsec run``'s:
each site's share then comes from the seeded stream ``SecureRandom.from_seed(seed, "client")``
at the position the coordinator computes by replaying the simulation's draws (public anyway:
reproducible noise protects nobody who knows the seed).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsec.config import ExperimentConfig
from fedsec.dp import SecureRandom
from fedsec.protocols.privacy.client_level import SkellamShares, sensitivity

STREAM = "client"
"""The purpose of the seeded noise stream under ``dp.reproducible`` (the simulation's)."""


@dataclass(frozen=True)
class ClientNoise:
    """One aggregation's noise rule: ``noise_multiplier`` z and the L2 sensitivity ``l2`` (encoder
    units) of one clipped update; the total variance mu = (z l2)^2 is split over t shares."""

    noise_multiplier: float
    l2: float

    @property
    def total_variance(self) -> float:
        return (self.noise_multiplier * self.l2) ** 2

    def shares(self, threshold: int, random: SecureRandom) -> SkellamShares:
        """One site's share for a session of threshold t >= 1: variance mu / t."""
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"threshold must be an integer >= 1, got {threshold!r}")
        return SkellamShares(self.total_variance / threshold, random)


def noise_rule(config: ExperimentConfig, noise_multiplier: float, length: int) -> ClientNoise:
    """The rule for updates of ``length`` values under ``config`` (the plan) and z."""
    s = config.secure
    _, l2 = sensitivity(s.bits, length, config.dp.max_grad_norm / s.clip)
    return ClientNoise(float(noise_multiplier), l2)


def share_stream(config: ExperimentConfig, offset: int | None) -> SecureRandom:
    """Where a site draws its share: the OS CSPRNG, or under ``dp.reproducible`` the plan's seeded
    stream ``offset`` bytes in."""
    if not config.dp.reproducible:
        return SecureRandom()
    random = SecureRandom.from_seed(config.seed, STREAM)
    random.load_state_dict({"key": random.state_dict()["key"], "offset": int(offset or 0)})
    return random
