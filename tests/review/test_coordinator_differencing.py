"""Adversary: the coordinator (alone, no colluding site). It runs the project's own masking
coordinator, but chooses which sites each aggregation includes and how often it asks.

Claim attacked (docs/deployment.md, "What each party sees"; issue 13): the coordinator sees the
federation's figures, "summed over at least the masking threshold of sites", never one
hospital's; and the masked protocol's guarantee that it learns only the sum of the updates.

Every test below is an attack against the unmodified site code (see ``harness``) and asserts the
secure behaviour (findings R1-R4, fixed: a site's pending contribution goes into at most one
aggregation, and evaluations/moments are answered once per plan round/run).
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.federated_eval import local_evaluation, sums_length
from fedsec.fl_core.parameters import set_vector

from fedsec.network.envelope import vector_bytes
from tests.review.harness import REFUSALS, Ring

N = 4


@pytest.fixture
def ring(tmp_path):
    ring = Ring(tmp_path / "d", N)
    yield ring
    ring.close()


def _always_positive(ring: Ring) -> np.ndarray:
    """A crafted logistic model: zero weights, bias +10, so it predicts class 1 for every record;
    its count of true positives is then the number of label-1 records in a site's test split."""
    vector = np.zeros(ring.sites[0].work.length, dtype=np.float32)
    vector[-1] = 10.0
    return vector


def test_one_evaluation_is_not_summed_twice_to_isolate_a_site(ring):
    model = _always_positive(ring)
    for k in range(N):
        ring.job(k, "evaluate", {"round": 1}, vector_bytes(model))
    length = sums_length(2)
    everyone = ring.aggregate(list(range(N)), purpose="statistics", round_index=1, length=length)
    assert set(everyone.participants) == set(range(N))
    # the same pending sums, a fresh masked session, the victim (site 0) left out
    try:
        others = ring.aggregate(list(range(1, N)), purpose="statistics", round_index=1, length=length)
    except REFUSALS:  # a refusal is the secure outcome
        return
    victim = ring.sites[0].work
    set_vector(victim.model, model)
    truth = local_evaluation(victim.model, victim.test_data, n_classes=2)
    difference = everyone.weighted_sum - others.weighted_sum
    assert truth[3] == np.count_nonzero(victim.test_data.y == 1) > 0
    # secure outcome: the coordinator cannot read one site's count of positive test labels
    assert round(float(difference[3])) != truth[3]


def test_a_site_refuses_repeated_and_out_of_plan_evaluations(ring):
    """Two evaluations of round 1 (a second crafted model) and one of round 999 (the plan has 3):
    each is answered and each aggregation with site 0 left out gives its exact sums."""
    model = _always_positive(ring)
    length = sums_length(2)
    learned = []
    for round_index, bias in ((1, 10.0), (1, -10.0), (999, 10.0)):
        model[-1] = bias
        for k in range(N):
            try:
                ring.job(k, "evaluate", {"round": round_index}, vector_bytes(model))
            except REFUSALS:  # a refused job is the secure outcome
                return
        everyone = ring.aggregate(list(range(N)), purpose="statistics", round_index=round_index,
                                  length=length)
        try:
            for k in range(1, N):
                ring.job(k, "evaluate", {"round": round_index}, vector_bytes(model))
            others = ring.aggregate(list(range(1, N)), purpose="statistics", round_index=round_index,
                                    length=length)
        except REFUSALS:  # a refused job or aggregation is the secure outcome
            return
        learned.append(everyone.weighted_sum - others.weighted_sum)
    y = ring.sites[0].work.test_data.y
    # with bias -10 every record is predicted 0: "correct" counts the label-0 records
    counts = [round(float(learned[0][1])), round(float(learned[1][1])), round(float(learned[2][1]))]
    assert counts != [np.count_nonzero(y == 1), np.count_nonzero(y == 0), np.count_nonzero(y == 1)]


def test_one_training_update_is_not_summed_twice_to_isolate_a_site(tmp_path):
    """Plan without DP (a site whose policy sets dp.required = false, i.e. it relies on masking
    alone). The same holds under DP-SGD: the coordinator then reads one site's noised update,
    which masking promised to hide."""
    ring = Ring(tmp_path / "d", N, extra='[dp]\nmode = "none"\n')
    try:
        start = np.zeros(ring.sites[0].work.length, dtype=np.float32)
        for k, site in enumerate(ring.sites):
            site.work.start(noise_multiplier=None)
            site.context.sessions.contribute("run", 1, max_rounds=3)  # Site._jobs records the round
            header = {"round": 1, "rng": np.random.default_rng(k).bit_generator.state}
            ring.job(k, "train", header, vector_bytes(start))
        length = start.size
        weights = [s.work.pending.weight for s in ring.sites]
        everyone = ring.aggregate(list(range(N)), purpose="update", round_index=1, length=length,
                                  max_weight=max(weights))
        try:
            others = ring.aggregate(list(range(1, N)), purpose="update", round_index=1, length=length,
                                    max_weight=max(weights))
        except REFUSALS:  # a refusal is the secure outcome
            return
        assert set(everyone.participants) == set(range(N)) and set(others.participants) == set(range(1, N))
        weight = everyone.total_weight - others.total_weight
        recovered = (everyone.weighted_sum - others.weighted_sum) / weight
        victim = ring.sites[0].work.pending
        assert weight == victim.weight
        # secure outcome: the coordinator cannot reconstruct site 0's own update (as encoded:
        # clipped per coordinate to secure.clip; unstandardised features give a few large weights)
        clip = ring.config.secure.clip
        assert not np.allclose(recovered, np.clip(victim.vector, -clip, clip), atol=1e-3)
    finally:
        ring.close()


def test_feature_means_of_one_site_are_not_isolated(ring):
    features = ring.sites[0].work.input_shape[0]
    sizes = [len(s.work.train_data) for s in ring.sites]
    for k in range(N):
        ring.job(k, "moments", {"stage": 1})
    everyone = ring.aggregate(list(range(N)), purpose="statistics", round_index=0, length=features,
                              max_weight=max(sizes))
    try:
        for k in range(1, N):
            ring.job(k, "moments", {"stage": 1})
        others = ring.aggregate(list(range(1, N)), purpose="statistics", round_index=0, length=features,
                                max_weight=max(sizes))
    except REFUSALS:  # a refusal is the secure outcome
        return
    victim = ring.sites[0].work.train_data.x
    recovered = (everyone.weighted_sum - others.weighted_sum) / sizes[0]
    assert everyone.total_weight - others.total_weight == sizes[0]
    assert not np.allclose(recovered, victim.mean(axis=0), rtol=1e-3, atol=1e-3)
