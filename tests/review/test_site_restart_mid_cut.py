"""Review 8b, item 3: a site restarted between the cut's calls 2 and 6 (after both sessions' share
keys, before the evaluation's masked input): its in-memory layers are gone, its ``site.db`` (rounds
trained, contributions consumed, masked sessions taken part in) survives.

Adversary: the coordinator alone, driving the project's UNMODIFIED site code (``SiteJobs`` on a real
``Site``; the restart is a new ``Site``/``SiteWork``/``SiteJobs`` over the same state folder, as
``fedsec join`` starting again builds them). It continues both sessions, replays the old setups,
opens new sessions for the same round, and re-sends ``train`` and ``evaluate``.

Properties: the restarted site refuses every stage of the old sessions (typed), never takes part in
the same (session, round) twice, its update of the round is never consumed twice (``rounds.replayed``
for a new ``train``), its evaluation of the round goes into at most one sum that completes, and
both old sessions complete with the others (or abort typed) summing exactly their contributions.
"""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.aggregation import ClientUpdate

from tests.fedsec.network.test_bundled_jobs import Party, train_job
from tests.fedsec.network.test_two_sessions import ROUND, N, Ring, deployment, first_two, layer  # noqa: F401

NO_SETUP = "a stage message without a setup"
TOOK_PART = "this identity already took part in this session and round"


def restart(ring: Ring, d, tmp_path, k: int) -> None:  # type: ignore[no-untyped-def]
    ring.parties[k].close()
    ring.parties[k] = Party(d, k, tmp_path / str(k))


def test_a_site_restarted_between_calls_2_and_6_refuses_the_old_sessions_and_contributes_once(
        deployment, tmp_path):  # noqa: F811
    ring = Ring(deployment, tmp_path)
    try:
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        first_two(ring)
        restart(ring, deployment, tmp_path, 0)
        assert ring.parties[0].jobs.layers == {}
        ring.drive(upd)
        ring.drive(ev, evaluate=True)
        assert ring.outcome("update") in ((1, 2), "aborted")
        assert ring.outcome("statistics") in ((1, 2), "aborted")
        assert ring.refusals.count(NO_SETUP) >= 2  # both old sessions' next stages at the restarted site
        assert ring.foreign == []
        party = ring.parties[0]
        assert party.records()[1] == [("update", 1)]  # consumed at call 1; its evaluation not yet
        # a new train of the round: refused (its update went into a setup before the restart)
        answer, _ = party.send(*train_job(party, ROUND))
        assert (answer["ok"], answer["reason"]) == (False, "rounds.replayed")
        # new evaluation sessions of the round (the others' evaluations are spent): whatever the
        # coordinator sends, the restarted site's evaluation is consumed at most once
        work = party.site.work
        for seed in (7, 8):
            again = layer(deployment, ring.config, seed).open(
                ROUND, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
                purpose="statistics")
            ring.sessions["statistics"] = again
            ring.drive(again, evaluate=True)
            assert ring.outcome("statistics") == "aborted"  # 1 and 2 refuse: their evaluations are spent
            assert party.records()[1] in ([("update", 1)], [("update", 1), ("evaluation", 1)])
        # refused at the late setup since session 8 (SiteState.late_setup), at evaluate before
        assert any(r == "contribution.used" or "already went into an aggregation" in r for r in ring.refusals)
    finally:
        ring.close()


def test_the_old_sessions_setup_replayed_to_a_restarted_site_is_refused(deployment, tmp_path):  # noqa: F811
    """The same (session, round) after a restart: refused from ``site.db``, before any key is drawn."""
    ring = Ring(deployment, tmp_path)
    try:
        ev = ring.sessions["statistics"]
        stage, out = ev.outgoing()  # the evaluation's setup + advertise keys, as call 1 carried it
        assert ring.answer(0, *ring.job(0, "statistics", stage, out[0])).keys() == {"statistics"}
        restart(ring, deployment, tmp_path, 0)
        assert ring.answer(0, *ring.job(0, "statistics", stage, out[0])) == {}
        assert ring.refusals == [TOOK_PART]
        assert ring.parties[0].jobs.layers == {}
    finally:
        ring.close()
