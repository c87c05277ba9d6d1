"""A site's answer to a train job says nothing about its records (review S4-1 (a), (c)).

Adversary: the coordinator alone, choosing the model, the plan's learning rate and how often it
asks for one round (it may claim to have resumed). Under DP a training that fails (a non-finite
local model, or an error raised by training) is a zero update with the site's usual weight,
answered ``ok`` and charged as usual, so the answer is the same whatever the records are; and a
site trains one (plan, round) at most ``MAX_TRAININGS`` times, counted in ``site.db`` across
restarts. The project's honest ``SiteWork`` and ``SiteState`` play the site.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort

from fedsec.network.envelope import vector_bytes
from fedsec.network.errors import PolicyRefused
from fedsec.network.site_state import MAX_TRAININGS, SiteState
from tests.review.harness import Ring

HUGE_LR = '[train]\nlr = 3e38\n'
"""A learning rate at which one noisy DP-SGD step overflows float32 for any records."""


def _train(ring: Ring, round_index: int = 1) -> None:
    site = ring.sites[0]
    header = {"round": round_index, "rng": np.random.default_rng(0).bit_generator.state}
    ring.job(0, "train", header, vector_bytes(np.zeros(site.work.length, dtype=np.float32)))


def test_under_dpsgd_a_failed_training_is_a_zero_update_answered_ok_and_charged(tmp_path):
    ring = Ring(tmp_path / "d", 3, extra=HUGE_LR + '[dp]\naccountant = "rdp"\n')
    try:
        work = ring.sites[0].work
        work.start(noise_multiplier=5.0)
        _train(ring)  # no ClientAbort: the answer is ok
        pending = work.pending
        assert pending is not None and pending.round == 1
        assert np.array_equal(pending.vector, np.zeros(work.length, dtype=np.float32))
        assert pending.weight == len(work.train_data)
        assert work.epsilon is not None and work.epsilon > 0  # the round is charged as usual
    finally:
        ring.close()


def test_without_dp_a_failed_training_is_still_the_simulations_failed_client(tmp_path):
    ring = Ring(tmp_path / "d", 3, extra=HUGE_LR + '[dp]\nmode = "none"\n')
    try:
        ring.sites[0].work.start(noise_multiplier=None)
        with pytest.raises(ClientAbort) as abort:
            _train(ring)
        assert abort.value.reason == "nonfinite"
    finally:
        ring.close()


def test_a_round_is_trained_at_most_max_trainings_times_across_restarts(tmp_path):
    state = SiteState(tmp_path)
    for _ in range(MAX_TRAININGS - 1):
        assert state.contribute("plan", 1, max_rounds=3) == 1
    state.close()
    state = SiteState(tmp_path)  # a restarted site keeps the count
    assert state.contribute("plan", 1, max_rounds=3) == 1
    with pytest.raises(PolicyRefused) as refused:
        state.contribute("plan", 1, max_rounds=3)
    assert refused.value.rule == "rounds.retrained"
    assert state.contribute("plan", 2, max_rounds=3) == 2  # the next round is its own count
    assert state.contribute("other-plan", 1, max_rounds=3) == 1
    state.consume("plan", "update", 2)
    with pytest.raises(PolicyRefused) as replayed:  # a consumed round stays rounds.replayed
        state.contribute("plan", 2, max_rounds=3)
    assert replayed.value.rule == "rounds.replayed"
    state.close()
