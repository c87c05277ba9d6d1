"""Review r10: the clipped-coordinate counter under client-level DP with masking.

FINDING (expected to FAIL today). docs/privacy.md §4 says the counter is "always 0, because
S <= c (secure.clip): constant". ``ClientLevelDP`` clips in float32, so an update whose mass sits
in one coordinate comes out a rounding step above S; with c = S (allowed: the check is c >= S, and
``Federation`` defaults c to max(1, S)) the encoder counts it as clipped. The count is summed
without noise and recorded in history (``clipped``): 1 when one client's update is (almost)
one-hot, 0 for its zero-out neighbour. Found by search: about a third of one-hot magnitudes
trigger it at S = 10.
"""

import numpy as np
import pytest

from dp import SecureRandom
from fl_core.aggregation import ClientUpdate
from protocols.masked import MaskedAggregation
from protocols.privacy import ClientLevelDP

S = 10.0


def _round(first: np.ndarray, layer_name: str = "masking") -> float:
    if layer_name == "masking":
        inner = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), clip=S, active=False)
    else:
        from protocols.paillier import PaillierAggregation

        inner = PaillierAggregation(max_weight=1, rng=np.random.default_rng(0), clip=S,
                                    threshold=2, key_bits=512, allow_insecure_key=True)
    layer = ClientLevelDP(inner, clip_norm=S, noise_multiplier=1.0,
                          random=SecureRandom.from_seed(0, "review"))
    rng = np.random.default_rng(1)
    updates = [ClientUpdate(0, first, 5.0)] + [
        ClientUpdate(k, rng.normal(size=6).astype(np.float32) * 0.1, 5.0) for k in range(1, 5)]
    return layer.aggregate(1, updates).metrics["clipped"]


@pytest.mark.parametrize("layer_name", ["masking", "paillier"])
def test_the_clipped_counter_does_not_depend_on_one_clients_update(layer_name):
    one_hot = np.zeros(6, np.float32)
    one_hot[2] = np.float32(275.00873)
    neighbour = np.zeros(6, np.float32)  # zero-out
    assert _round(neighbour, layer_name) == 0
    assert _round(one_hot, layer_name) == 0, (
        f"{layer_name}: the clipped count reveals that client 0's update is one-hot")
