"""The stage-replay search of :mod:`tests.fedsec.network.test_stage_replay` against the masking layer's
unmodified :class:`MaskingSite` (client-level DP, so each site also draws a noise share)."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.privacy.client_level import clip_update
from hypothesis import given
from hypothesis import strategies as st

from fedsec.network.client_noise import noise_rule
from tests.fedsec.network.test_client_level_layers import LENGTH as RING_LENGTH
from tests.fedsec.network.test_client_level_layers import N as RING_N
from tests.fedsec.network.test_client_level_layers import (
    Ring,
    Z,
    _config,
    study,  # noqa: F401 - fixture
)
from tests.fedsec.network.test_stage_replay import SETTINGS, Replayer, _aggregate


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_masking_site_answers_each_stage_once(study, data):  # noqa: F811
    config = _config(reproducible=False)
    rng = np.random.default_rng(4)
    vectors = [clip_update(rng.normal(0, 0.4, RING_LENGTH).astype(np.float32), config.dp.max_grad_norm)
               for _ in range(RING_N)]
    ring = Ring(study, config, vectors)
    replayer = Replayer(ring.exchange, ring.layers, data)
    coordinator = ring.coordinator()
    coordinator.client_noise = (noise_rule(config, Z, RING_LENGTH), SecureRandom())
    coordinator.context.exchange = replayer.exchange
    _aggregate(coordinator, [ClientUpdate(c, np.zeros(RING_LENGTH, np.float32), 1) for c in range(RING_N)])
    replayer.replay()
    replayer.check()
    masked = [a for a in replayer.answered.values() if "masked input" in a]
    assert all(a.count("masked input") == 1 for a in masked)
