"""Review 10: the coordinator killed at the calls of a keys-ahead round that
``tests/review/test_resume_cut_opened_ahead.py`` leaves out, then resumed from its checkpoint.

Adversary: a crash (the coordinator process dies at the k-th exchange of a round, before the jobs
reach the sites or after they answered; ``fedsec serve --resume`` then starts from the last
checkpoint). The sites are the project's UNMODIFIED ``SiteJobs`` on real ``Site`` objects
(``test_resume_cut_opened_ahead.Federation``); rounds 2 and 3 run the 6-exchange schedule, round 3's
update keys ride in round 2's evaluation calls.

Checked, for a crash at round 2's unmask (call 3, before and after) and at round 3's calls 1, 4, 6:
a crash before any job of the round reached a site loses nothing (history and both generators as
the uninterrupted run's); otherwise the round is lost and only it (every other round whole, all
four sites); no site consumes a (kind, round) twice; each site's ledger charges exactly the rounds it
trained; epsilon never decreases; no site sets up more than one update session of a round before
its training (``late_update_setups``); and every site's update of the lost round was consumed by
the dead coordinator's aggregation (none went into a second one, none was trained again).
"""

from __future__ import annotations

import math

import pytest

from tests.review.test_resume_cut_opened_ahead import (
    COLUMNS,
    ROUNDS,
    Federation,
    _check_sites,
    _generators,
    _history,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    federation = Federation(tmp_path_factory.mktemp("ref10") / "d")
    try:
        summary = federation.coordinator()
        return summary, _history(federation.out / "history.csv"), _generators(federation)
    finally:
        federation.close()


def _late(site) -> list[tuple[int, int]]:
    return sorted(site.state._db.execute("SELECT round, count FROM late_update_setups").fetchall())


@pytest.mark.parametrize("point", [(2, 3, False), (2, 3, True), (3, 1, False), (3, 1, True), (3, 4, True),
                                   (3, 6, True)])
def test_a_crash_at_any_call_of_a_keys_ahead_round_loses_at_most_that_round(point, uninterrupted, tmp_path):
    _, reference, generators = uninterrupted
    lost = None if point[1:] == (1, False) else point[0]
    federation = Federation(tmp_path / "d")
    try:
        assert federation.coordinator(crash=point) is None
        _check_sites(federation)
        summary = federation.coordinator(resume=True)
        assert summary is not None and summary["rounds_run"] == ROUNDS
        _check_sites(federation)
        history = _history(federation.out / "history.csv")
        assert [int(r["round"]) for r in history] == list(range(1, ROUNDS + 1))
        if lost is None:
            for a, b in zip(history, reference, strict=True):
                for key in COLUMNS:
                    if key.startswith("epsilon"):
                        assert math.isclose(float(a[key]), float(b[key]), rel_tol=1e-9, abs_tol=1e-9), key
                    else:
                        assert a[key] == b[key], (a["round"], key)
            assert _generators(federation) == generators
        for row in history:
            if int(row["round"]) == lost:
                assert row["status"].startswith("aborted") and row["participants"] == "0", row
            else:
                assert row["status"] == "ok" and row["participants"] == "4", row
        epsilons = [float(r["epsilon"]) for r in history]
        assert all(b >= a for a, b in zip(epsilons, epsilons[1:])), epsilons
        for site in federation.sites.values():
            assert site.state.contributed(site.sha) == list(range(1, ROUNDS + 1))
            assert sorted(r for kind, r in site.consumed() if kind == "update") == [1, 2, 3]
            assert all(count == 1 for _, count in _late(site)), _late(site)
            trainings = dict(site.state._db.execute("SELECT round, count FROM trainings").fetchall())
            assert trainings == {1: 1, 2: 1, 3: 1}, trainings  # the lost round was never trained again
    finally:
        federation.close()
