"""Review 11b (site side): a MALICIOUS coordinator with the prefetched first call (commit 8d0d159)
against UNMODIFIED sites (``SiteJobs`` on real ``Site`` objects: the ring of
``tests/fedsec/network/test_keys_ahead.py``). The prefetch changes only when the coordinator posts
round r + 1's first call (its update's consistency check, with round r + 1's evaluation's advertise
keys as the second part); the sites' code is unchanged, so a coordinator that posts it at any other
time, twice, or with another evaluation's keys must get nothing the honest schedule does not give.

Held (plain tests):

- the prefetched call posted TOO EARLY (before round r's evaluation unmask, i.e. before the update's
  masked input): refused, nothing trained or consumed, round r's evaluation still exact;
- the prefetched call REPLAYED (the consistency check answered twice): the second is refused and
  the update is summed at most once, exactly, or the sum aborts;
- round r + 1's EVALUATION opened early and its advertise keys (a new statistics setup) posted while
  round r's evaluation is before its unmask: the sites refuse that setup and the refusal drops
  their statistics layer, so round r's evaluation cannot be unmasked (no sum released, nothing
  consumed twice): a denial of service the coordinator has anyway, never a second use of a sum.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.aggregation import ClientUpdate

from tests.fedsec.network.test_keys_ahead import EVALUATED, NEXT, N, Ring
from tests.fedsec.network.test_keys_ahead import deployment as deployment  # noqa: F401 (the fixture)
from tests.fedsec.network.test_train_ahead import speculated_call
from tests.fedsec.network.test_two_sessions import layer


def _prefetched(ring: Ring, *, rider: tuple[str, str, dict[int, bytes]] | None = None) -> dict[int, bytes]:
    """The update's consistency check to every site (with ``rider``'s stage as the second part);
    each site's reply for the update."""
    upd = ring.updates[0]
    stage, out = upd.outgoing()
    assert stage == "consistency check"
    replies = {}
    for c in range(N):
        also = (rider[0], rider[1], rider[2][c]) if rider is not None else None
        got = ring.answer(c, *ring.job(c, "update", NEXT, stage, out[c], also=also))
        if "update" in got:
            replies[c] = got["update"]
    return replies


def test_the_prefetched_call_before_the_updates_input_is_refused_and_records_nothing(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ring.update_keys_in_evaluation_calls()
        upd = ring.updates[0]
        before = ring.consumed()
        # the update is at its masked input (from the keys ahead): a consistency check is out of order
        for c in range(N):
            got = ring.answer(c, *ring.job(c, "update", NEXT, "consistency check", b"\x00" * 64))
            assert "update" not in got
        assert ring.consumed() == before
        assert [p.records()[0] for p in ring.parties] == [[]] * N  # nothing trained for round 2
        # the evaluation (its unmask: the call that would have carried the training) is still exact
        got = speculated_call(ring)
        assert all("statistics" in g for g in got.values())
        assert ring.outcome(ring.evaluation) == (0, 1, 2)
        assert all("update" not in g for g in got.values())  # the update layer was dropped: refused
        # (speculated_call trained each site directly to know its update; the carried part was refused
        # before its training, and no masked input took the update)
        assert all(("update", NEXT) not in used for used in ring.consumed())
        assert not upd.done or ring.outcome(upd) == "aborted"
    finally:
        ring.close()


def test_the_prefetched_call_replayed_sums_each_update_at_most_once(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ring.update_keys_in_evaluation_calls()
        speculated_call(ring)
        upd = ring.updates[0]
        stage, out = upd.outgoing()
        first = {c: ring.answer(c, *ring.job(c, "update", NEXT, stage, out[c])) for c in range(N)}
        again = {c: ring.answer(c, *ring.job(c, "update", NEXT, stage, out[c])) for c in (0,)}
        assert "update" not in again[0]  # the replay is refused (site 0 then drops its layer)
        upd.take({c: g["update"] for c, g in first.items() if "update" in g})
        ring.drive(upd, NEXT)
        assert ring.outcome(upd) in ("aborted", (1, 2))
        for used in ring.consumed():
            assert len(used) == len(set(used)) and used.count(("update", NEXT)) == 1
    finally:
        ring.close()


def test_the_next_evaluation_opened_early_cannot_reuse_the_evaluations_sums(deployment, tmp_path):
    """Round 2's evaluation's advertise keys ride with round 2's update consistency check BEFORE
    round 1's evaluation unmask (the prefetch posted early, mixing the sessions): the sites refuse
    that setup (no evaluation of round 2 pending, and its input stage not reached), and the refusal
    drops their statistics layer: round 1's evaluation can no longer be unmasked (aborted)."""
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ring.update_keys_in_evaluation_calls()
        work = ring.parties[0].site.work
        early = layer(deployment, ring.config, 77).open(
            NEXT, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
            purpose="statistics")
        stage, out = early.outgoing()
        assert stage == "advertise keys"
        before = ring.consumed()
        # the update is still at its masked input: its part is refused, the evaluation's key part taken
        upd = ring.updates[0]
        u_stage, u_out = upd.outgoing()
        got = {c: ring.answer(c, *ring.job(c, "update", NEXT, u_stage, u_out[c],
                                           also=("statistics", stage, out[c]))) for c in range(N)}
        early.take({c: g["statistics"] for c, g in got.items() if "statistics" in g})
        assert ring.consumed() == before
        # round 1's evaluation unmask now: no site holds its layer any more
        ev = ring.evaluation
        e_stage, e_out = ev.outgoing()
        assert e_stage == "unmask"
        replies = {}
        for c in range(N):
            got2 = ring.answer(c, *ring.job(c, "statistics", EVALUATED, e_stage, e_out[c]))
            if "statistics" in got2:
                replies[c] = got2["statistics"]
        ev.take(replies)
        assert ring.outcome(ev) == "aborted"  # no sum of round 1's evaluation is released
        for used in ring.consumed():
            assert len(used) == len(set(used))
            assert used.count(("evaluation", EVALUATED)) == 1
    finally:
        ring.close()
