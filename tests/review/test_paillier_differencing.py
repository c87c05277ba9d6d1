"""R1/R3 under Paillier with a key holder (custody ``key_holder``): the coordinator puts the sites'
one pending contribution into two aggregations, the second without the victim, and the key holder
decrypts both sums (each over >= its threshold of 3 submissions). Their difference is the victim's
weighted vector.

The sites are the project's ``PaillierSite`` layers built as ``Site._jobs`` builds them, each new
setup handed the same contribution. Fixed: ``SiteWork.contribution`` consumes it at the first setup
(durably in a deployed site), and a site layer refuses a contribution it already put into an
aggregation (``SiteContext.spent``) whatever the sequence number.
The key holder is the real :class:`KeyHolderService` behind mTLS (the fixtures of
``tests/fedsec/network/test_deploy_paillier_layer.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate

from fedsec.network.layers import LAYERS
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 - fixtures
    LENGTH,
    Sites,
    coordinator_context,
    fresh_site_memory,
    inputs,
    keyholder,
    plan,
    sites,
)
from tests.review.harness import REFUSALS


@pytest.mark.slow
def test_a_pending_contribution_is_not_submitted_twice_under_paillier(study, sites, keyholder, tmp_path):  # noqa: F811
    address, runner = keyholder
    base = plan("key_holder", address)
    config = dataclasses.replace(base, dp=dataclasses.replace(base.dp, reproducible=False))
    vectors, weights = inputs(1)
    side = Sites(study, config, sites, vectors, weights, tmp_path / "sites")
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 7))
    zeros = np.zeros(LENGTH, np.float32)
    everyone = coordinator.aggregate(1, [ClientUpdate(c, zeros, 1) for c in range(4)], purpose="update")
    try:
        others = coordinator.aggregate(1, [ClientUpdate(c, zeros, 1) for c in (1, 2, 3)], purpose="update")
    except REFUSALS:
        return
    assert set(everyone.participants) == {0, 1, 2, 3} and set(others.participants) == {1, 2, 3}
    assert everyone.total_weight - others.total_weight == weights[0]
    recovered = (everyone.weighted_sum - others.weighted_sum) / weights[0]
    assert not np.allclose(recovered, np.clip(vectors[0], -1, 1), atol=1e-3)
