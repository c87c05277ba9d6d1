"""Review 8b, item 3 (low): the cut lets a site set up a statistics aggregation before its sums exist
(late input), and nothing bounds those setups. Before the cut, a setup needed a pending contribution
of its (purpose, round) and was refused (``NOT_PENDING``) before anything was drawn or written; now
a statistics setup without one is accepted for ANY round, even outside the plan's 1..``rounds``
(where the site's own ``evaluate`` refuses with ``evaluation.round``), as often as the coordinator
sends one with a fresh nonce: each draws the client's keys and shares, signs, and writes one
durable row (``INSERT`` into ``site.db`` ``sessions``, synchronous FULL) that is never removed.

Adversary: the coordinator alone, with the project's UNMODIFIED site code (``SiteJobs`` on a real
``Site``; only the gRPC hop left out). It gains no contribution (none is consumed) but makes the
site's durable state grow without bound at one call each, and makes it take part in sessions for
rounds it would never evaluate.

Expected: a late statistics setup names a round of the plan, and a site takes part in at most a
bounded number of sessions of one (purpose, round) before its contribution is given (3, as
``MAX_TRAININGS`` bounds retrains). Fixed (session 8): ``SiteState.late_setup`` counts them durably
in ``site.db`` and ``SiteJobs`` refuses the setup before any key is drawn or session row written
(``MAX_LATE_SETUPS``).
"""

from __future__ import annotations

import sqlite3

import numpy as np
from fedsec.fl_core.aggregation import ClientUpdate

from tests.fedsec.network.test_bundled_jobs import Party
from tests.fedsec.network.test_two_sessions import deployment, layer  # noqa: F401

BOUND = 3


def _setup(party: Party, d, seed: int, round_index: int) -> dict:  # type: ignore[no-untyped-def]
    length = party.site.work.evaluation_length
    ring = [ClientUpdate(c, np.zeros(length, np.float32), 1.0) for c in range(3)]
    session = layer(d, party.config, seed).open(round_index, ring, purpose="statistics")
    stage, out = session.outgoing()
    answer, _ = party.send({"kind": "layer", "round": round_index, "stage": stage, "purpose": "statistics"},
                           out[0])
    return answer


def _rows(tmp_path, round_index: int) -> int:  # type: ignore[no-untyped-def]
    db = sqlite3.connect(tmp_path / "s0" / "site.db")
    try:
        return db.execute("SELECT count(*) FROM sessions WHERE round = ?", (round_index,)).fetchone()[0]
    finally:
        db.close()


def test_late_statistics_setups_are_bounded_and_name_a_round_of_the_plan(deployment, tmp_path):  # noqa: F811
    party = Party(deployment, 0, tmp_path / "s0")
    try:
        outside = 10**6
        answers = [_setup(party, deployment, seed, outside) for seed in range(5)]
        repeated = [_setup(party, deployment, 100 + seed, 1) for seed in range(20)]
        assert party.records() == ([], [])  # nothing trained, nothing consumed: no contribution at stake
        assert all(a["ok"] is False for a in answers), answers
        assert _rows(tmp_path, outside) == 0
        assert sum(a["ok"] is True for a in repeated) <= BOUND
        assert _rows(tmp_path, 1) <= BOUND
    finally:
        party.close()
