"""Client-level DP in a deployment: the rule by which a site draws its share of the noise.

A site clips its update to the plan's L2 bound S (``dp.max_grad_norm``), weights it 1, and adds
to its encoded words a shifted Skellam share of variance mu / (t - c) before the secure layer
masks or encrypts them, where

- mu = (z D2)^2 is the noise the plan's accountant charges for one round: z is the noise
  multiplier the coordinator calibrated, accepted only after the site recomputed its own epsilon
  over the plan's rounds with it (:meth:`fedsec.network.site_work.SiteWork.start`), and D2 the L2
  sensitivity in encoder units from the site's own copy of the plan (bits, coordinate clip c,
  S, the model's length): :func:`fedsec.protocols.privacy.client_level.sensitivity`;
- t is the threshold of the masked session the site takes part in: the site's own
  :class:`~fedsec.protocols.masked.MaskedClient` refuses a t below its floor (its policy's
  ``min_threshold``, the plan's, the corrupt-fraction floor) and never helps unmask a sum of
  fewer than t inputs; or the Paillier key's signed decryption threshold;
- c is the number of sites that may collude with the coordinator under the threat model the
  site itself enforces (:func:`site_colluders`): the corrupt fraction is the larger of the
  plan's ``secure.corrupt`` (the site's own copy) and its policy's ``aggregation.min_corrupt``,
  taken of the roster it knows; for masking capped at ring size - 1 as the masking layer's
  corrupt count is (the site itself is honest), for Paillier not capped (a site does not know
  how many submissions the coordinator expects).

Every sum the coordinator can release holds at least t contributions, at most c of them its
colluders' (who know or omit their shares), so at least t - c honest shares of mu / (t - c): at
least mu, whatever t, ring, noise multiplier or dropouts the coordinator chooses. A larger t
buys smaller shares only at the price of a larger sum; t - c < 1 is refused before any draw.

This is the simulation's rule (:class:`~fedsec.protocols.privacy.ClientLevelDP`: the threshold
of the round actually run), so with ``dp.reproducible`` the deployed history is ``fedsec run``'s:
each site's share then comes from the seeded stream ``SecureRandom.from_seed(seed, "client")``
at the position the coordinator computes by replaying the simulation's draws (public anyway:
reproducible noise protects nobody who knows the seed).

The argument needs every honest share of one sum drawn for the SAME mu and the same t - c (review
S6-1: a coordinator that hands sites different z, or different plans, would otherwise mix shares of
mu_a / (t - c) with smaller ones in a sum site a counts as holding mu_a). So every site computes
its **noise context** (:func:`noise_context`: SHA-256 of its own plan's canonical digest and its
own rule: z, the sensitivity, S, t, c, the mechanism) from what it itself holds, never from a
field it is sent, and binds it into what the honest participants of a sum cryptographically agree
on: the Paillier round spec (its digest enters every tag; a client refuses a spec bound to another
context) and the masked session id (every key a site signs and every mask it derives binds it; a
site whose context differs sees another session and aborts). Sites whose contexts differ are never
in one released sum.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from fedsec.config import ExperimentConfig
from fedsec.dp import SecureRandom
from fedsec.protocols.masked.policy import corrupt_count, population_corrupt
from fedsec.protocols.privacy.client_level import SkellamShares, sensitivity, share_variance

NO_CONTEXT = bytes(32)
"""The noise context of a sum that carries no client-level noise (statistics, other DP modes)."""
MECHANISM = b"skellam"
"""The noise mechanism a site draws its share with (bound into the noise context)."""
_CONTEXT_DOMAIN = b"fedsec/client-noise/context/v1"

STREAM = "client"
"""The purpose of the seeded noise stream under ``dp.reproducible`` (the simulation's)."""


@dataclass(frozen=True)
class ClientNoise:
    """One aggregation's noise rule: ``noise_multiplier`` z and the L2 sensitivity ``l2`` (encoder
    units) of one clipped update; the total variance mu = (z l2)^2 is split over t - c shares."""

    noise_multiplier: float
    l2: float

    @property
    def total_variance(self) -> float:
        return (self.noise_multiplier * self.l2) ** 2

    def shares(self, threshold: int, colluders: int, random: SecureRandom) -> SkellamShares:
        """One site's share for a session of threshold t >= 1 against c >= 0 colluders: variance
        mu / (t - c); :class:`~fedsec.protocols.privacy.client_level.NoHonestMargin` (a
        ``ProtocolAbort``) when t - c < 1."""
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"threshold must be an integer >= 1, got {threshold!r}")
        if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
            raise ValueError(f"colluders must be an integer >= 0, got {colluders!r}")
        return SkellamShares(share_variance(self.total_variance, threshold=threshold, colluders=colluders),
                             random)


def site_corrupt(config: ExperimentConfig, policy: Any = None) -> float:
    """The corrupt fraction a site assumes: the plan's ``secure.corrupt`` or, when larger, its
    policy's ``aggregation.min_corrupt`` (a plan below it was refused at join)."""
    floor = getattr(policy, "min_corrupt", 0.0) if policy is not None else 0.0
    return max(float(config.secure.corrupt), float(floor))


def site_population(*, roster: int, policy: Any = None) -> int:
    """How many sites this site takes the corrupt fraction of: its plan's ``roster`` size or,
    when its policy pins ``aggregation.peers``, the study it pinned (the peers and itself), if
    larger. A coordinator that shows the site a SUBSET of the study (review S6-3 of session 6)
    cannot lower c by it: the fraction is still taken of the whole study. If a policy lists the
    site itself among its peers, the count is one too many, which only raises c."""
    peers = getattr(policy, "peers", None) if policy is not None else None
    return max(roster, len(set(peers)) + 1) if peers else roster


def site_colluders(config: ExperimentConfig, *, roster: int, policy: Any = None,
                   ring: int | None = None) -> int:
    """c for this site's noise share: floor(corrupt x population) with the fraction of
    :func:`site_corrupt` and the population of :func:`site_population`; for a masked ``ring`` of
    that many members, capped at ring - 1 (:func:`~fedsec.protocols.masked.policy.corrupt_count`,
    the masking layer's count)."""
    corrupt = site_corrupt(config, policy)
    population = site_population(roster=roster, policy=policy)
    if ring is None:
        return population_corrupt(population, corrupt)
    return corrupt_count(ring, corrupt, population=max(population, ring))


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


def noise_context(config: ExperimentConfig, rule: ClientNoise, *, threshold: int = 0,
                  colluders: int = 0) -> bytes:
    """The 32-byte digest of one sum's noise context, as THIS party sees it: SHA-256 of the plan's
    canonical digest (:meth:`ExperimentConfig.sha256`: clip S, bits, corrupt fraction, roster,
    rounds, accountant...), the noise multiplier z and sensitivity D2 (float64), S, the threshold
    t and colluders c the share is sized for (0 where a signed session fixes them, as masking's
    parameters do), and the mechanism. Two honest parties agree on it iff they drew (or expect)
    shares of the same mu / (t - c) under the same plan."""
    w = struct.pack(">32s32sddd2Q", hashlib.sha256(_CONTEXT_DOMAIN).digest(),
                    bytes.fromhex(config.sha256()), float(rule.noise_multiplier), float(rule.l2),
                    float(config.dp.max_grad_norm), int(threshold), int(colluders))
    return hashlib.sha256(w + MECHANISM).digest()
