"""Adversary: the coordinator, writing the plan. It cannot change a site's ``SITE.toml``, but it
chooses ``dp.delta`` in (0, 1), and every epsilon the site's policy and lifetime ledger cap is
"at the plan's delta" (docs/deployment.md, policy reference). Fixed (R5): the policy bounds delta
(``dp.max_delta``, default 1e-5), so the lax plan is refused by ``check_plan``.

At delta = 0.5 an (epsilon, delta) guarantee allows publishing half the records outright; here
it also buys the coordinator a noise level that the same site, under the same default policy,
refuses at delta = 1e-5, while its lifetime ledger records only the plan's epsilon.
"""

from __future__ import annotations

import pytest

from fedsec.network.errors import PolicyRefused
from fedsec.network.policy import SitePolicy, check_plan
from tests.review.harness import Ring

ROUNDS = 30
SIGMA = 1.0


def _start(tmp_path, name: str, *, delta: float, target: float) -> None:
    """Site 0 of a plan at (``target``, ``delta``) starts DP-SGD with the coordinator's SIGMA."""
    extra = f"[dp]\ndelta = {delta}\ntarget_epsilon = {target}\n"
    ring = Ring(tmp_path / name, 4, rounds=ROUNDS, extra=extra)
    try:
        check_plan(SitePolicy(), ring.config)
        ring.sites[0].work.start(noise_multiplier=SIGMA)
    finally:
        ring.close()


@pytest.mark.slow
def test_a_plan_cannot_buy_less_noise_with_a_large_delta(tmp_path):
    # control: at delta 1e-5 this noise costs the site epsilon ~14.7 over the plan's rounds, above
    # the default policy's dp.max_epsilon_run of 10 (the largest plan it would admit)
    with pytest.raises(PolicyRefused) as refused:
        _start(tmp_path, "meaningful", delta=1e-5, target=SitePolicy().max_epsilon_run)
    assert refused.value.rule == "dp.noise"
    # the attack: the same noise, a plan at delta 0.5 that claims epsilon 3
    with pytest.raises(PolicyRefused):
        _start(tmp_path, "lax", delta=0.5, target=3.0)
