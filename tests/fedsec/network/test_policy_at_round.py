"""A site's ``aggregation.min_sites`` / ``min_threshold`` hold at every aggregation (review R10).

Adversary: the coordinator, alone, choosing the ring of each masked aggregation (any subset of
the roster, for any purpose). The sites are the unmodified ``MaskingSite`` layers of the harness,
given their ``SITE.toml`` policy as ``Site._jobs`` gives it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fedsec.fl_core.federated_eval import sums_length

from fedsec.network.envelope import vector_bytes
from fedsec.network.layers import SiteContext
from fedsec.network.layers.base import round_floor
from fedsec.network.policy import SitePolicy
from tests.review.harness import REFUSALS, Ring

N = 5


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    ring = Ring(tmp_path_factory.mktemp("d"), N)  # the demo plan: min_sites = 3
    yield ring
    ring.close()


def test_the_floor_is_the_larger_of_policy_and_plan(ring):
    context: SiteContext = ring.sites[0].context
    plan_sites, plan_threshold = round_floor(context)
    assert plan_sites == ring.config.federation.min_sites == 3
    context.policy = SitePolicy(min_sites=4, min_threshold=plan_threshold + 1)
    try:
        assert round_floor(context) == (4, plan_threshold + 1)
    finally:
        context.policy = None


def test_search_every_ring_smaller_than_the_policy_is_refused(ring):
    """Exhaustive over the rings that contain site 0 (the site with the stricter policy) and over
    both purposes: site 0 is in a sum only when the ring has >= its min_sites sites."""
    policy = SitePolicy(min_sites=4, min_threshold=2)
    ring.sites[0].context.policy = policy
    vector = np.zeros(ring.sites[0].work.length, dtype=np.float32)
    try:
        round_index = 0
        for size in range(3, N + 1):
            for others in itertools.combinations(range(1, N), size - 1):
                ids = [0, *others]
                round_index += 1
                vector[-1] += 1.0  # another model each time (a new contribution)
                model = vector_bytes(vector)
                if round_index > ring.config.rounds:  # each plan round is evaluated once: a new plan run
                    for k in range(N):
                        ring.sites[k].work.record = type(ring.sites[k].work.record)()
                    round_index = 1
                for k in ids:
                    ring.job(k, "evaluate", {"round": round_index}, model)
                try:
                    result = ring.aggregate(ids, purpose="statistics", round_index=round_index,
                                            length=sums_length(2))
                except REFUSALS:
                    assert size < policy.min_sites
                    continue
                assert (0 in result.participants) == (size >= policy.min_sites), (ids, result.participants)
                if size < policy.min_sites:
                    assert ring.aborts.get(0)
    finally:
        ring.sites[0].context.policy = None
