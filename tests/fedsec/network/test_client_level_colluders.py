"""Client-level DP in the deployed masking layer against the coordinator with c colluding sites.

Adversary: the coordinator, lying in its own :class:`MaskingCoordinator` (any ring of 3..N
sites, any announced threshold, its own noise rule, sites it silences at any stage), together
with the c sites the plan tolerates: ``secure.corrupt = 0.45`` of a roster of 5, so
c = min(2, ring - 1). The colluders know their own shares; the adversary places all c of them
inside the released sum. The sites are the project's unmodified :class:`MaskingSite` with the
noise rule each built from the noise multiplier it checked. Claim (docs/privacy.md section 4):
the honest sites' shares in any sum the coordinator obtains add up to >= mu, or it obtains
nothing; a threshold that leaves no honest share (t - c < 1) is refused by every site before
it draws (``NO_MARGIN``).
"""

from __future__ import annotations

import numpy as np
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort

from fedsec.config import make_config
from fedsec.network.client_noise import noise_rule
from fedsec.network.layers.masking import NO_MARGIN
from tests.fedsec.network.test_client_level_layers import LENGTH, N, Ring, Z, _vectors, study  # noqa: F401

CORRUPT = 0.45


def _config():
    return make_config({"federation.sites": [f"site-{k}" for k in range(N)], "data.clients": N,
                        "dp.mode": "client", "dp.reproducible": False, "seed": 3,
                        "dp.max_grad_norm": 0.5, "secure.corrupt": CORRUPT})


def test_every_ring_and_threshold_leaves_mu_of_honest_noise_or_nothing(study, monkeypatch):  # noqa: F811
    """Exhaustive over ring sizes 3..N, announced thresholds 1..degree, the colluders the
    coordinator provisions its word room for (the plan's c, or a lie of 0), and one silenced
    site at each stage or none."""
    monkeypatch.setattr("fedsec.protocols.masked.server.minimum_threshold", lambda *args, **kwargs: 1)
    config = _config()
    released, margins = [], []
    for size in range(3, N + 1):
        c = min(int(CORRUPT * N), size - 1)
        for claimed in range(1, size):
            for silent_from, lie in [(None, False), (None, True), (1, False), (2, False), (3, False),
                                     (4, False)]:
                ring = Ring(study, config, _vectors(3, 0.5))
                if silent_from is not None:
                    ring.silent_from[size - 1] = silent_from
                coordinator = ring.coordinator()
                coordinator.rules.parameters = lambda n, size=size, claimed=claimed: (size - 1, claimed)
                if lie:  # the coordinator's own rule told there are no colluders
                    coordinator.rules.tolerated_colluders = lambda n: 0
                coordinator.client_noise = (noise_rule(config, Z, LENGTH), SecureRandom())
                try:
                    result = coordinator.aggregate(1, [ClientUpdate(k, np.zeros(LENGTH, np.float32), 1.0)
                                                       for k in range(size)])
                except ProtocolAbort:
                    if claimed - c < 1 and lie:
                        margins.append(set(ring.aborts.values()))
                    continue
                released.append((size, claimed, silent_from, lie))
                shares = sorted(ring.layers[k].shares.variance for k in result.participants)
                honest = sum(shares[:len(shares) - c])  # the c colluders in the sum, the largest shares
                assert honest >= ring.rule.total_variance * (1 - 1e-12), (size, claimed, silent_from, lie)
    assert {(4, 3, None, False), (5, 4, None, False)} <= set(released)  # the search is not vacuous
    assert not any(lie for *_, lie in released)  # a word room for c = 0 is too narrow: refused
    assert margins and all(reasons == {NO_MARGIN} for reasons in margins)  # t <= c: refused first
