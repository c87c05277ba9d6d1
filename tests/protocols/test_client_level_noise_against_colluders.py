"""Distributed client-level noise against the colluders the secure layer tolerates.

Each client adds a Skellam share of variance mu / (t - c), c the colluders the masking layer
tolerates (``secure.corrupt``, default 0.1 of the clients). Colluders know their own shares, so
the noise that protects an honest client from a server-plus-colluders coalition is
(survivors - c) mu / (t - c) >= mu by construction. The adversary below plays random dropouts at
the lowest threshold the clients accept, semi-honest and authenticated modes (the chosen-dropout
search is ``test_client_level_chosen_dropouts.py``).
"""

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked.policy import corrupt_count, minimum_threshold
from fedsec.protocols.privacy import ClientLevelDP


@pytest.mark.parametrize("active", [True, False])
def test_released_sums_carry_mu_beyond_the_tolerated_colluders_shares(active):
    n, dropout = 10, 0.3
    probe = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), active=active,
                              dropout=dropout)
    floor = minimum_threshold(n, probe.parameters(n)[0], probe.tolerated_corrupt, active=active,
                              population=n)
    inner = MaskedAggregation(max_weight=1, rng=np.random.default_rng(5), dropout=dropout,
                              active=active, threshold=floor)
    layer = ClientLevelDP(inner, clip_norm=1.0, noise_multiplier=1.0,
                          random=SecureRandom(b"\x03" * 32))
    t, c = inner.min_contributions(n), corrupt_count(n, inner.tolerated_corrupt, population=n)
    released = []
    for r in range(8):
        updates = [ClientUpdate(i, np.full(4, 0.1, np.float32), 1.0) for i in range(n)]
        try:
            released.append(len(layer.aggregate(r + 1, updates).participants))
        except ProtocolAbort:
            pass
    assert released
    assert all((s - c) / (t - c) >= 1.0 for s in released), (t, c, released)
