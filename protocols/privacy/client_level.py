"""Client-level differential privacy (McMahan et al. 2018) around an aggregation protocol.

Each client's update is clipped to L2 norm S and enters the sum with weight 1; the released sum
carries noise, so one client's whole contribution is protected. Neighbouring runs differ in one
client's update being replaced by zero ("zero-out": who takes part is visible to the server
anyway), and the average divides by the number of contributions, which is public.

- Central (plain aggregation): the server adds N(0, (z S)^2) per coordinate to the sum, drawn
  from :class:`dp.SecureRandom`; each round is a Gaussian mechanism with noise multiplier z.
- Distributed (masking or Paillier): the server must never see a clean sum, so each client adds
  integer noise to its encoded words before masking or encryption: a symmetric Skellam share of
  variance mu / (t - c), where t is the fewest contributions the protocol releases for the
  updates it ACCEPTS (its threshold for that many) and c the colluding clients its threat model
  tolerates (``tolerated_colluders``: the corrupt count of the masking layer, the corrupt
  fraction of the parties for Paillier). Updates the protocol would reject are set aside first,
  so t is the threshold of the round actually run, and dropouts after that leave at least t in
  any released sum, at least t - c of them honest. The server together with c colluders, who
  know (or omit) their own shares, thus still faces Skellam noise of variance >= mu in every
  released sum (sums of independent Skellams are Skellam), whichever clients it makes drop out;
  a result holding fewer than t contributions is refused (``ProtocolAbort``), never released,
  and t - c < 1 is refused before anything is drawn (:func:`share_variance`). In the encoder's
  integer units (coordinate clip c >= S, L = 2^bits - 1 levels) one client moves the sum by at
  most D2 = (L / 2)(S / c) + sqrt(d) in L2 (the scaled update plus at most one unit of
  stochastic rounding per coordinate) and D1 = min(sqrt(d) D2, D2^2) in L1, and mu = (z D2)^2;
  each round is accounted as a Skellam mechanism (Agarwal et al. 2021). Shares are shifted by 20
  standard deviations so that they are non-negative words, the protocol's modulus or slots are
  widened by that room, and the shifts are subtracted after the sum (a share outside the room,
  probability below 1e-80, is refused rather than wrapped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from fedsec.dp import SecureRandom
from fedsec.dp.ledger import Event, GaussianEvent, SkellamEvent
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER
from fedsec.fl_core.aggregation import (
    AggregateResult,
    AggregationProtocol,
    ClientUpdate,
    PlainAggregation,
    Purpose,
)
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols.encoding import validate_updates
from fedsec.protocols.errors import ProtocolAbort

SHIFT_STDS = 20


class SkellamShares:
    """One client's shifted Skellam noise share: values in [0, slack] with mean ``offset``."""

    def __init__(self, variance: float, random: SecureRandom) -> None:
        if not variance > 0:
            raise InvalidParameterError(f"noise variance must be > 0, got {variance}")
        self.variance, self.random = variance, random
        self.offset = math.ceil(SHIFT_STDS * math.sqrt(variance)) + 1
        self.slack = 2 * self.offset

    def draw(self, length: int) -> np.ndarray:
        shifted = self.random.skellam(self.variance, length) + self.offset
        if shifted.size and (int(shifted.min()) < 0 or int(shifted.max()) > self.slack):
            raise ProtocolAbort("a noise share fell outside its room (probability < 1e-80)")
        return shifted


def share_variance(total_variance: float, *, threshold: int, colluders: int) -> float:
    """One honest client's share: ``total_variance`` mu / (t - c), so that the t - c honest shares
    any released sum of >= t contributions holds add up to >= mu even when c of the t are the
    adversary's. Raises :class:`NoHonestMargin` (a ``ProtocolAbort``) when t - c < 1: no sum the
    protocol may release is sure to hold an honest share."""
    for name, value, low in (("threshold", threshold, 1), ("colluders", colluders, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}")
    if threshold - colluders < 1:
        raise NoHonestMargin(threshold, colluders)
    return total_variance / (threshold - colluders)


class NoHonestMargin(ProtocolAbort):
    """t - c < 1: a released sum of t contributions may hold no honest noise share."""

    def __init__(self, threshold: int, colluders: int) -> None:
        super().__init__(f"threshold {threshold} leaves no honest noise share against {colluders} "
                         f"tolerated colluders (client-level DP needs threshold - colluders >= 1)")
        self.threshold, self.colluders = threshold, colluders


def sensitivity(bits: int, length: int, clip_ratio: float = 1.0) -> tuple[float, float]:
    """(L1, L2) sensitivity in encoder units of one client's update of ``length`` values clipped
    to L2 norm S, for an encoder of ``bits`` with coordinate clip c = S / ``clip_ratio`` >= S: the
    encoder scales by L / (2c), and stochastic rounding moves each coordinate by less than 1."""
    l2 = ((1 << bits) - 1) / 2 * clip_ratio + math.sqrt(length)
    return min(math.sqrt(length) * l2, l2 * l2), l2


def distributed_round_event(noise_multiplier: float, *, bits: int, length: int,
                            clip_ratio: float) -> SkellamEvent:
    """What one released round of distributed client-level noise costs: a Skellam mechanism of
    total variance mu = (z D2)^2 for the (L1, L2) :func:`sensitivity` of an update of ``length``
    values (``clip_ratio`` = S / c <= 1). The simulation's :class:`ClientLevelDP` and a deployed
    site (which recomputes it from its own copy of the plan) both account it with this."""
    l1, l2 = sensitivity(bits, length, clip_ratio)
    return SkellamEvent(l1, l2, (noise_multiplier * l2) ** 2, 1)


class ClientLevelDP(AggregationProtocol):
    """Clip each update to ``clip_norm``, weight it 1, and make the released sum noisy.

    Args:
        inner: the protocol that sums: ``PlainAggregation`` (central noise) or one with a
            ``client_noise`` hook, ``min_contributions`` and ``tolerated_colluders`` (masking,
            Paillier: distributed noise).
        clip_norm: S > 0; the inner protocol's coordinate clip must be at least S.
        noise_multiplier: z >= 0.5 (noise std / sensitivity; ``dp.noise.MIN_NOISE_MULTIPLIER``).
        random: the noise source.

    Clients report no training metric (``client_metrics`` is empty): under client-level DP the
    released noisy sum is all that depends on a client's data.
    """

    client_metrics: frozenset[str] = frozenset()

    def __init__(self, inner: AggregationProtocol, *, clip_norm: float, noise_multiplier: float,
                 random: SecureRandom) -> None:
        if not (math.isfinite(clip_norm) and clip_norm > 0):
            raise InvalidParameterError(f"clip_norm must be > 0, got {clip_norm}")
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= MIN_NOISE_MULTIPLIER):
            raise InvalidParameterError(
                f"noise_multiplier must be >= {MIN_NOISE_MULTIPLIER} (the Gaussian sampler is "
                f"truncated at 8.57 standard deviations), got {noise_multiplier}")
        self.inner, self.clip_norm, self.noise_multiplier = inner, float(clip_norm), noise_multiplier
        self.random = random
        self.central = isinstance(inner, PlainAggregation)
        if not self.central:
            if not all(hasattr(inner, a) for a in ("client_noise", "min_contributions", "tolerated_colluders",
                                                   "max_weight")):
                raise InvalidParameterError(f"{type(inner).__name__} cannot carry client noise")
            if getattr(inner, "clip", clip_norm) < clip_norm:
                raise InvalidParameterError("the protocol's coordinate clip is below the L2 clip")
        self.name = f"{inner.name}+client-dp"

    def round_events(self, length: int) -> list[Event]:
        """What one released round of ``length`` values costs."""
        if self.central:
            return [GaussianEvent(self.noise_multiplier, 1.0, 1)]
        return [distributed_round_event(self.noise_multiplier, bits=self.inner.bits, length=length,
                                        clip_ratio=self.clip_norm / self.inner.clip)]

    def _sensitivity(self, length: int) -> tuple[float, float]:
        return sensitivity(self.inner.bits, length, self.clip_norm / self.inner.clip)

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        if purpose != "update":
            return self.inner.aggregate(round_index, updates, purpose=purpose)
        clipped = [ClientUpdate(u.client_id, clip_update(u.vector, self.clip_norm), 1.0) for u in updates]
        if self.central:
            result = self.inner.aggregate(round_index, clipped)
            noise = self.random.normal(result.weighted_sum.size, self.noise_multiplier * self.clip_norm)
            return _with_sum(result, result.weighted_sum + noise)
        accepted, rejected = validate_updates(clipped, self.inner.max_weight)
        if not accepted:
            raise ProtocolAbort("no valid client update to sum")
        _, l2 = self._sensitivity(int(accepted[0].vector.size))
        total_variance = (self.noise_multiplier * l2) ** 2
        fewest = self.inner.min_contributions(len(accepted))
        variance = share_variance(total_variance, threshold=fewest,
                                  colluders=self.inner.tolerated_colluders(len(accepted)))
        self.inner.client_noise = SkellamShares(variance, self.random)
        try:
            result = self.inner.aggregate(round_index, accepted)
        finally:
            self.inner.client_noise = None
        if len(result.participants) < fewest:
            raise ProtocolAbort(f"a sum of {len(result.participants)} contributions would carry "
                                f"less than the accounted noise (needs >= {fewest})")
        metrics = dict(result.metrics)
        metrics["rejected"] = metrics.get("rejected", 0.0) + len(rejected)
        return AggregateResult(weighted_sum=result.weighted_sum, total_weight=result.total_weight,
                               participants=result.participants,
                               dropped=tuple(r.client_id for r in rejected) + tuple(result.dropped),
                               upload_bytes=result.upload_bytes, metrics=metrics)


def clip_update(vector: np.ndarray, bound: float) -> np.ndarray:
    """``vector`` scaled to L2 norm at most ``bound`` (float32; a non-finite or non-array value is
    returned as is, for the protocol to reject)."""
    if not isinstance(vector, np.ndarray) or not np.isfinite(vector).all():
        return vector  # the inner protocol rejects it and says so
    wide = vector.astype(np.float64)
    norm = float(np.linalg.norm(wide))
    if norm <= 0:
        return vector
    if norm <= bound:
        return vector.astype(np.float32)
    # scaled in float64 just below S, so that float32 rounding cannot lift the norm above S
    return (wide * (bound / norm * (1 - 2.0**-20))).astype(np.float32)


def _with_sum(result: AggregateResult, weighted_sum: np.ndarray) -> AggregateResult:
    return AggregateResult(weighted_sum=weighted_sum, total_weight=result.total_weight,
                           participants=result.participants, dropped=result.dropped,
                           upload_bytes=result.upload_bytes, metrics=result.metrics)
