"""Review S6-1 under masking: one masked sum mixes honest shares drawn for different noise multipliers.

The same flaw as ``test_paillier_mixed_noise.py`` (the argument "the >= t - c honest shares of mu /
(t - c) of any released sum hold >= mu" needs every honest share drawn for the SAME mu, and nothing
binds mu into a session), on the masking layer, which this session did not change: a masked
session carries one ``word_slack`` and a site accepts any slack at least its own share's room
(``MaskedClientPolicy.min_word_slack``), so sites handed different noise multipliers by the
coordinator (``SiteWork.start(noise_multiplier=...)``, a per-site job) take part in one session.

Adversary: the coordinator alone. Sites: the review harness's unmodified ``SiteWork`` +
``MaskingSite`` (4 sites, client-level plan); site 0 is handed z = 4, the others z = 1; the
coordinator is the project's ``MaskingCoordinator``, its noise rule site 0's (so the session's
slack covers every share). Site 0 charges its ledger for mu_0 = (4 D2)^2, but the released sum holds
its own share and three shares drawn for mu_1 = mu_0 / 16: well below mu_0.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate

from fedsec.network.envelope import vector_bytes
from fedsec.network.layers import CoordinatorContext
from fedsec.network.layers.masking import MaskingCoordinator
from tests.review.harness import REFUSALS, Ring

N = 4
PLAN = '[dp]\nmode = "client"\nnoise_multiplier = 1.0\ntarget_epsilon = 0.0\nmax_grad_norm = 0.5\n'
Z = {0: 4.0, 1: 1.0, 2: 1.0, 3: 1.0}


@pytest.mark.slow
def test_a_masked_sum_mixes_shares_drawn_for_different_noise(tmp_path):
    ring = Ring(tmp_path / "d", N, extra=PLAN, rounds=1)
    try:
        for k, site in enumerate(ring.sites):
            site.work.start(noise_multiplier=Z[k])
        model = np.zeros(ring.sites[0].work.length, dtype=np.float32)
        for k, site in enumerate(ring.sites):
            state = np.random.default_rng(k).bit_generator.state
            ring.job(k, "train", {"round": 1, "rng": state}, vector_bytes(model))
            site.context.client_noise = site.work.client_noise  # what Site._jobs hands the layer

        def exchange(stage: str, messages: dict[int, bytes]) -> dict[int, bytes]:
            replies = {}
            for c, message in messages.items():
                reply = ring.layer_message(c, stage, message)
                if reply is not None:
                    replies[c] = reply
            return replies

        context = CoordinatorContext(config=ring.config, rng=np.random.default_rng(), names=ring.names,
                                     certificates=ring.certificates, peers=ring.peers, max_weight=1,
                                     exchange=exchange)
        coordinator = MaskingCoordinator(context)
        coordinator.client_noise = (ring.sites[0].work.client_noise, SecureRandom())  # the widest room
        try:
            result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(len(model), np.float32), 1.0)
                                               for c in range(N)], purpose="update")
        except REFUSALS:
            return  # the secure outcome: no such sum is released
        assert 0 in result.participants
        honest = sum(ring.sites[c].layer.shares.variance for c in result.participants)
        mu_0 = ring.sites[0].work.client_noise.total_variance
        assert honest >= mu_0 * (1 - 1e-12), f"honest noise {honest / mu_0:.3f} of site 0's mu"
    finally:
        ring.close()


ASSIGNMENTS = [{0: 4.0, 1: 1.0, 2: 1.0, 3: 1.0}, {0: 1.0, 1: 2.0, 2: 1.0, 3: 2.0},
               {0: 2.0, 1: 2.0, 2: 2.0, 3: 4.0}]


@pytest.mark.slow
@pytest.mark.parametrize("z", ASSIGNMENTS, ids=["one high", "two pairs", "one low"])
def test_a_searching_coordinator_never_mixes_noise_contexts(tmp_path, z):
    """Fixed (S6-1), searched: the coordinator hands the sites the noise multipliers ``z`` and runs
    one masked session per choice of its own rule (each site's), dropping every site that aborts
    and going on with the rest. A released sum only ever holds sites handed the coordinator's z
    (the others aborted: their session id binds their own noise context), and its honest noise is
    at least every participant's mu."""
    distinct = sorted(set(z.values()))
    ring = Ring(tmp_path / "d", N, extra=PLAN, rounds=len(distinct))
    try:
        for k, site in enumerate(ring.sites):
            site.work.start(noise_multiplier=z[k])
        released = 0
        for round_index, chosen in enumerate(distinct, start=1):
            model = np.zeros(ring.sites[0].work.length, dtype=np.float32)
            for k, site in enumerate(ring.sites):
                state = np.random.default_rng(k).bit_generator.state
                ring.job(k, "train", {"round": round_index, "rng": state}, vector_bytes(model))
                site.context.client_noise = site.work.client_noise
            aborted: set[int] = set()

            def exchange(stage: str, messages: dict[int, bytes]) -> dict[int, bytes]:
                replies = {}
                for c, message in messages.items():
                    try:
                        reply = ring.layer_message(c, stage, message)
                    except REFUSALS:
                        aborted.add(c)  # a dropout: the coordinator goes on without it
                        continue
                    if reply is not None:
                        replies[c] = reply
                return replies

            context = CoordinatorContext(config=ring.config, rng=np.random.default_rng(), names=ring.names,
                                         certificates=ring.certificates, peers=ring.peers, max_weight=1,
                                         exchange=exchange)
            coordinator = MaskingCoordinator(context)
            owner = next(k for k in range(N) if z[k] == chosen)
            coordinator.client_noise = (ring.sites[owner].work.client_noise, SecureRandom())
            try:
                updates = [ClientUpdate(c, np.zeros(len(model), np.float32), 1.0) for c in range(N)]
                result = coordinator.aggregate(round_index, updates, purpose="update")
            except REFUSALS:  # nothing released (too few sites left share the coordinator's context)
                assert aborted >= {k for k in range(N) if z[k] != chosen}
                continue
            released += 1
            assert {z[c] for c in result.participants} == {chosen}
            assert aborted == {k for k in range(N) if z[k] != chosen}
            honest = sum(ring.sites[c].layer.shares.variance for c in result.participants)
            for c in result.participants:
                mu = ring.sites[c].work.client_noise.total_variance
                assert honest >= mu * (1 - 1e-12)
        # a sum of >= 3 sites (the plan's min_sites) handed one z still goes through; nothing else does
        assert released == sum(list(z.values()).count(v) >= 3 for v in distinct)
    finally:
        ring.close()
