"""Adversary: the coordinator. A site's ``SITE.toml`` sets the fewest sites per round and the
smallest threshold (``aggregation.min_sites``, ``aggregation.min_threshold``); the site checks
them against the plan when it joins (``check_plan``). The coordinator then runs a masked
aggregation over a smaller ring. Fixed (R10): the site checks the ring and threshold of every
aggregation against its policy and the plan (``round_floor``, the masked client's policy).
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.federated_eval import sums_length

from fedsec.network.envelope import vector_bytes
from fedsec.network.policy import SitePolicy, check_plan
from tests.review.harness import REFUSALS, Ring

N = 6


def test_a_site_refuses_a_ring_smaller_than_its_policy(tmp_path):
    ring = Ring(tmp_path / "d", N, min_sites=N)
    try:
        policy = SitePolicy(min_sites=N, min_threshold=3)
        check_plan(policy, ring.config, min_sites=ring.config.federation.min_sites)  # admitted
        model = np.zeros(ring.sites[0].work.length, dtype=np.float32)
        for k in range(N):
            ring.job(k, "evaluate", {"round": 1}, vector_bytes(model))
        try:
            result = ring.aggregate([0, 1, 2], purpose="statistics", round_index=1, length=sums_length(2))
        except REFUSALS:
            return
        assert 0 not in result.participants, (
            f"site 0 (policy: >= {policy.min_sites} sites, threshold >= {policy.min_threshold}) was summed "
            f"in a ring of {len(result.participants)} at threshold {result.metrics['secagg_threshold']:g}")
    finally:
        ring.close()
