"""Adversary: the coordinator alone, client-level DP over Paillier with a key holder.

Claim attacked (docs/deployment.md "Client-level DP deployed"; docs/privacy.md section 4): each
released sum of a round carries >= mu of Skellam noise, and each site's ledger charges the round
once ("the update: clipped to S, weight 1, plus a Skellam share of mu / t, inside the secure
layer: ledger"). A site's ``KeyHolderSite`` answers every ``paillier/submit`` it is sent with a
fresh encryption of its one update *and a fresh noise share* (``SiteEncoding.words`` draws again);
the coordinator reaches the layer it built for the round with stage messages that carry no setup
(``Site._jobs`` builds a new layer only for a message that starts with one), so nothing is
consumed again. K decrypted sums of the same round, each noised with >= mu, average to the round's
clipped sum with mu / K: the promised noise is gone while every ledger charged one round.

Sites: the project's ``PaillierSite`` layers as ``Site._jobs`` builds them (the fixtures of
``tests/fedsec/network/test_deploy_paillier_layer.py``), with the noise rule a site builds after
checking z; the key holder is the real :class:`KeyHolderService` behind mTLS; the coordinator is
the project's own layer. The secure outcome is a refusal of the repeated sums, or no gain from them.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.privacy.client_level import clip_update

from fedsec.config import make_config
from fedsec.network.client_noise import noise_rule
from fedsec.network.layers import LAYERS
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 - fixtures
    LENGTH,
    NAMES,
    Sites,
    _plan_values,
    coordinator_context,
    fresh_site_memory,
    keyholder,
    sites,
)
from tests.review.harness import REFUSALS
from tests.review.test_paillier_resubmit import _without_setups

K = 12


@pytest.mark.slow
def test_repeated_sums_of_one_round_do_not_average_the_client_noise_away(study, sites, keyholder,  # noqa: F811
                                                                          tmp_path):
    address, _ = keyholder
    config = make_config({**_plan_values("key_holder", address), "dp.mode": "client",
                          "dp.max_grad_norm": 0.5, "dp.reproducible": False})
    rng = np.random.default_rng(3)
    vectors = {c: clip_update(rng.normal(0, 0.4, LENGTH).astype(np.float32), 0.5) for c in range(4)}
    side = Sites(study, config, NAMES, vectors, {c: 1 for c in range(4)}, tmp_path / "sites")
    rule = noise_rule(config, 1.1, LENGTH)
    for context in side.contexts.values():
        context.client_noise = rule
    context = coordinator_context(study, config, side, 5)
    coordinator = LAYERS["paillier"][0](context)
    coordinator.client_noise = (rule, SecureRandom())
    updates = [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)]
    sums = [coordinator.aggregate(1, updates).weighted_sum]
    context.exchange = _without_setups(side.exchange)
    try:
        for _ in range(K - 1):
            coordinator.client_noise = (rule, SecureRandom())
            result = coordinator.aggregate(1, updates)
            assert result.participants == (0, 1, 2, 3)
            sums.append(result.weighted_sum)
    except REFUSALS:  # a refusal is the secure outcome
        return
    clean = np.sum(list(vectors.values()), axis=0).astype(np.float64)
    one_release = float(np.mean([(s - clean) ** 2 for s in sums]))  # the noise of one released sum
    averaged = float(np.mean((np.mean(sums, axis=0) - clean) ** 2))
    assert one_release > 0
    # secure outcome: what the coordinator knows of the round's sum still carries one release's noise
    assert averaged >= one_release / 2
