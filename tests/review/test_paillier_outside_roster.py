"""Review S5 (item 1), fixed: under key-holder custody a site provisions its client-level noise
share for c = floor(corrupt x ITS roster) colluders, and the key holder (started without
``--sites``, the default) enrols any site the study's root certified. Before the fix a coordinator
that enrolled a certified site outside the plan's roster, and had it submit, obtained a decrypted
sum of t = 3 submissions of which only 2 were the roster's honest sites: mu / 3 each, 2 mu / 3 < mu
in all, although no site of the victims' roster colluded (c = 0 holds).

Adversary: the coordinator (unmodified layer code, run with a 4-name roster the sites never saw)
plus one certified site that is not in the plan (hosp-c, running the unmodified site layer under
the coordinator's plan); the key holder and the roster's sites are the project's unmodified
parties. Now each spec carries the digest of the roster it is for: the honest sites refuse the
coordinator's 4-name roster, so no sum of >= t submissions exists and nothing is decrypted (the
key holder logs the refused request). The search over every other way to mix outsiders in is
``tests/review/test_paillier_roster_search.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.paillier.client import OTHER_ROSTER

from fedsec.audit.log import read_events
from fedsec.config import make_config
from fedsec.network.client_noise import noise_rule
from fedsec.network.layers import LAYERS
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 (fixtures, by name)
    LENGTH,
    NAMES,
    Sites,
    _plan_values,
    coordinator_context,
    fresh_site_memory,
    keyholder,
    sites,
)

pytestmark = [pytest.mark.usefixtures("sites", "fresh_site_memory")]
Z, CLIP = 1.1, 0.5
ROSTER = NAMES[:3]  # what the honest sites' plan lists: hosp-a, hosp-b, hosp-x (c = floor(0.3) = 0)


def _config(names, address):
    return make_config({**_plan_values("key_holder", address), "data.clients": len(names),
                        "federation.sites": list(names), "dp.mode": "client", "dp.max_grad_norm": CLIP,
                        "dp.reproducible": False})


def test_a_site_outside_the_roster_no_longer_counts_towards_the_threshold(study, request, tmp_path):  # noqa: F811
    address, runner = request.getfixturevalue("keyholder")
    honest_plan, lying_plan = _config(ROSTER, address), _config(NAMES, address)
    side = Sites(study, lying_plan, NAMES, {c: np.full(LENGTH, 0.05, np.float32) for c in range(4)},
                 {c: 1 for c in range(4)}, tmp_path / "sites")
    rule = noise_rule(honest_plan, Z, LENGTH)
    for c, context in side.contexts.items():
        if c < 3:  # the roster's honest sites: their own copy of the plan (3 sites)
            context.config, context.names = honest_plan, ROSTER
        context.client_noise = rule
    coordinator = LAYERS["paillier"][0](coordinator_context(study, lying_plan, side, 5))
    coordinator.client_noise = (rule, SecureRandom())
    # the victims hosp-a, hosp-b and the outsider hosp-c (id 3); hosp-x is simply not asked
    updates = [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in (0, 1, 3)]
    try:
        result = coordinator.aggregate(1, updates)
    except ProtocolAbort as refused:  # nothing decrypted: the round aborts, visibly
        assert "contributions; only sums of >= 3" in str(refused)
    else:
        honest = [c for c in result.participants if c < 3]
        honest_noise = sum(side.layers[c].encoding.noise.variance for c in honest)
        raise AssertionError(f"released a sum with {honest_noise / rule.total_variance:.3f} mu of noise")
    # the honest sites refused the spec of a roster they never agreed to; the outsider submitted
    assert side.aborts == {0: OTHER_ROSTER, 1: OTHER_ROSTER}
    events = read_events(runner.service.state.audit_path)
    assert not [e for e in events if e.action == "decrypt.served"]
    refused = [e for e in events if e.action == "decrypt.refused"]
    assert len(refused) == 1 and "contributors, need between 3" in refused[0].payload()["reason"]
