"""The clipped-coordinate counter under client-level DP with masking or Paillier is constant (0).

The encoder counts coordinates beyond its clip c >= S and sums the count without noise.
``ClientLevelDP`` clips in float64 to S (1 - 2^-20) before rounding to float32, so a clipped
update never comes out a rounding step above S, and with c = S nothing is counted: the count
does not depend on one client's update (it was 1 for about a third of one-hot magnitudes when
the clip was computed in float32).
"""

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.privacy import ClientLevelDP
from fedsec.protocols.privacy.client_level import clip_update
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

S = 10.0


def _round(first: np.ndarray, layer_name: str = "masking") -> float:
    if layer_name == "masking":
        inner = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), clip=S, active=False)
    else:
        from fedsec.protocols.paillier import PaillierAggregation

        inner = PaillierAggregation(max_weight=1, rng=np.random.default_rng(0), clip=S,
                                    threshold=2, key_bits=512, allow_insecure_key=True)
    layer = ClientLevelDP(inner, clip_norm=S, noise_multiplier=1.0,
                          random=SecureRandom.from_seed(0, "counter"))
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


@settings(max_examples=60, deadline=None)
@given(vector=arrays(np.float32, st.integers(1, 40),
                     elements=st.floats(-1e6, 1e6, width=32, allow_nan=False)),
       bound=st.sampled_from([0.1, 1.0, 10.0, 3.7]))
def test_a_clipped_update_never_exceeds_s_after_float32_rounding(vector, bound):
    clipped = clip_update(vector, bound)
    assert clipped.dtype == np.float32
    norm = float(np.linalg.norm(clipped.astype(np.float64)))
    original = float(np.linalg.norm(vector.astype(np.float64)))
    assert norm <= bound
    if original <= bound:
        assert np.array_equal(clipped, vector)  # short updates pass unchanged
    else:
        assert norm >= bound * (1 - 2.0**-19)  # and long ones lose no more than the margin
