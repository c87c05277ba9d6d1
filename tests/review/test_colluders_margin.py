"""Adversary: the coordinator with the c colluding sites the masking layer tolerates (c = 2 of a
roster of 20 at ``secure.corrupt = 0.1``), choosing which honest sites "drop out".

Claim attacked (docs/privacy.md section 4, docs/deployment.md "Client-level DP deployed"): every
update sum the coordinator obtains carries honest Skellam noise of variance >= mu, the noise the
ledger charges, even against the coordinator together with c sites, who know (or omit) their
own shares. Review finding S4-7: with shares of mu / t a coordinator that picks its dropouts
gets a sum of max(quorum, t + 1) = 12 contributions at n = 20 (t = 11), two of them the
colluders', so only (12 - 2) / 11 mu = 0.91 mu of honest noise. The fix: each honest share has
variance mu / (t - c), so the >= t - c honest shares of any released sum hold >= mu.

The sites are the project's unmodified ``SiteWork`` + ``MaskingSite`` (``tests.review.harness``)
under a client-level plan, each with the noise rule ``SiteWork.start`` builds from the noise
multiplier it accepted; the coordinator is the project's ``MaskingCoordinator`` with its
client-level noise rule. Per round the adversary withholds the masked-input stage from chosen
honest sites (as a stage deadline would make them drop out) and names two colluders among the
sites left in the sum. The honest noise is computed from the share variances the honest sites in
the released sum actually drew with (``MaskingSite.shares``): it must be >= mu, or nothing is
released.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked.policy import corrupt_count

from fedsec.network.envelope import vector_bytes
from fedsec.network.layers import CoordinatorContext
from fedsec.network.layers.masking import MaskingCoordinator
from tests.review.harness import REFUSALS, Ring

N = 20
Z = 1.0
PLAN = '[dp]\nmode = "client"\nnoise_multiplier = 1.0\ntarget_epsilon = 0.0\nmax_grad_norm = 0.5\n'
ATTACKS = [(1, range(12, 20), (0, 1)),   # 8 withheld: the sum of 12 the sites' floor allows
           (2, range(11, 20), (3, 7)),   # 9 withheld: below the survivor quorum
           (3, range(16, 20), (5, 15))]  # 4 withheld: a larger sum, colluders elsewhere


def _round(ring: Ring, round_index: int, withheld: range,
           colluders: tuple[int, ...]) -> tuple[int, float, float]:
    """Train every site for ``round_index``, run the project's coordinator over all N with the
    masked input withheld from ``withheld``; (contributions in the released sum, the honest share
    variance in it, mu), or
    raise what an honest party raises when it refuses."""
    model = np.zeros(ring.sites[0].work.length, dtype=np.float32)
    for k, site in enumerate(ring.sites):
        state = np.random.default_rng(round_index * 100 + k).bit_generator.state
        ring.job(k, "train", {"round": round_index, "rng": state}, vector_bytes(model))
        site.context.client_noise = site.work.client_noise  # what Site._jobs hands the layer
    deliver = ring.layer_message

    def exchange(stage: str, messages: dict[int, bytes]) -> dict[int, bytes]:
        replies = {}
        for c, message in messages.items():
            if c in withheld and stage == "masked input":  # the coordinator never delivers it
                continue
            try:
                reply = deliver(c, stage, message)
            except ClientAbort:
                ring.sites[c].layer = None
                continue
            if reply is not None:
                replies[c] = reply
        return replies

    context = CoordinatorContext(config=ring.config, rng=np.random.default_rng(), names=ring.names,
                                 certificates=ring.certificates, peers=ring.peers, max_weight=1,
                                 exchange=exchange)
    coordinator = MaskingCoordinator(context)
    rule = ring.sites[0].work.client_noise
    coordinator.client_noise = (rule, SecureRandom())
    updates = [ClientUpdate(c, np.zeros(len(model), np.float32), 1.0) for c in range(N)]
    result = coordinator.aggregate(round_index, updates, purpose="update")
    assert set(colluders) <= set(result.participants)
    honest = [c for c in result.participants if c not in colluders]
    variance = sum(ring.sites[c].layer.shares.variance for c in honest)
    return len(result.participants), variance, rule.total_variance


@pytest.mark.slow
def test_chosen_dropouts_and_colluders_never_get_a_sum_with_less_than_mu_of_honest_noise(tmp_path):
    ring = Ring(tmp_path / "d", N, extra=PLAN, rounds=len(ATTACKS))
    try:
        c = corrupt_count(N, ring.config.secure.corrupt, population=N)
        assert c == 2
        for work in (s.work for s in ring.sites):
            work.start(noise_multiplier=Z)
        released = {}
        for round_index, withheld, colluders in ATTACKS:
            assert len(colluders) == c
            try:
                size, honest, mu = _round(ring, round_index, withheld, colluders)
            except REFUSALS:  # refusing to unmask is the secure outcome
                continue
            released[round_index] = size
            # secure outcome: the honest shares in the released sum add up to >= mu
            assert honest >= mu * (1 - 1e-12), (round_index, honest / mu)
        # the attack of S4-7 is played: its sum of 12 is released (now with >= mu), 11 is refused
        assert released == {1: 12, 3: 16}, released
    finally:
        ring.close()
