"""A coordinator that sends a noise multiplier below the Gaussian sampler's floor (0.5) gets a clean
``dp.noise`` refusal from the site (exit 3 path), not a failed job (review, "also" list)."""

from __future__ import annotations

import pytest
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER

from fedsec.network.errors import PolicyRefused
from tests.review.harness import Ring


@pytest.mark.parametrize("sigma", [1e-9, 0.1, MIN_NOISE_MULTIPLIER * 0.999])
def test_a_noise_multiplier_below_the_floor_is_a_policy_refusal(tmp_path, sigma):
    ring = Ring(tmp_path / "d", 3, extra="[dp]\ntarget_epsilon = 1000.0\n")
    try:
        with pytest.raises(PolicyRefused) as refused:
            ring.sites[0].work.start(noise_multiplier=sigma)
        assert refused.value.rule == "dp.noise" and "floor" in str(refused.value)
        assert ring.sites[0].work.strategy is None
    finally:
        ring.close()
